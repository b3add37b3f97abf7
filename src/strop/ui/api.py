"""The JSON endpoints of `strop ui`, as plain functions of the request's path parts and query.

    GET  /api/runs?project=P&status=S          the runs table (the page polls it)
    GET  /api/runs/RUN                         one run: record, descriptor, pinned, checkpoints, evaluations
    GET  /api/runs/RUN/metrics                 every metrics row
    GET  /api/runs/RUN/log                     the last 64 kB of the worker's log
    GET  /api/runs/RUN/steps                   the steps rollouts.jsonl holds, with counts
    GET  /api/runs/RUN/rollouts?step=&group=&minReward=&maxReward=&term=&termMin=&kind=&q=&errors=1&offset=&limit=
    POST /api/runs/RUN/cancel | /resume        the control plane's cancel and resume
    GET  /api/models, /api/projects            tuned models with lineage; project names
    GET  /api/evaluations                      the newest evaluations
    GET  /api/evaluations/EVAL                 one evaluation with its per-item rows (at most MAX_ITEMS)
    GET  /api/env-evals, /api/env-evals/ID     `strop envs eval` reports: pass@1, rubrics, headroom per split
    GET  /api/compare?a=EVAL&b=EVAL            two finished evaluations side by side, with the statistics and
                                               the dashboard's panels as data (strop.report.panels)
    POST /api/sample {model, prompt, maxTokens, temperature}   one reply from a base or tuned model

Each returns (HTTP status, JSON-able payload); a StropError becomes a 4xx with its message.
"""

from __future__ import annotations

import json
import math
import re

from strop.control import env_evals, evaluations, folder_runs, models, projects, run_view, runs
from strop.control.run_view import tail
from strop.errors import StropError
from strop.paths import strop_home
from strop.report.panels import dashboard_panels
from strop.ui.rollouts import MAX_PAGE, RolloutQuery, index_for

RUN_ID = re.compile(r"run-[0-9a-f]{8}")
EVAL_ID = re.compile(r"eval-[0-9a-f]{8}")
MAX_ITEMS = 5000
FOLDER_PROJECT = folder_runs.PROJECT


class BadRequest(StropError):
    """A request the UI cannot answer as asked (400)."""


def handle(method: str, parts: list[str], query: dict[str, str], body: bytes = b"") -> tuple[int, object]:
    if parts == ["sample"] and method == "POST":
        return 200, _sample(body)
    if parts == ["runs"] and method == "GET":
        return 200, {"runs": _runs(query.get("project") or None, query.get("status") or None)}
    if parts == ["models"] and method == "GET":
        return 200, {"models": _models()}
    if parts == ["projects"] and method == "GET":
        return 200, {"projects": [p["name"] for p in projects.list_all()] + [FOLDER_PROJECT]}
    if parts == ["evaluations"] and method == "GET":
        return 200, {"evaluations": run_view.evaluations()}
    if len(parts) == 2 and parts[0] == "evaluations" and method == "GET":
        report = evaluations.report(_eval_id(parts[1]), items=True)
        report["itemsShown"], report["items"] = min(len(report["items"]), MAX_ITEMS), report["items"][:MAX_ITEMS]
        return 200, report
    if parts == ["env-evals"] and method == "GET":
        return 200, {"envEvals": env_evals.list_all()}
    if len(parts) == 2 and parts[0] == "env-evals" and method == "GET":
        if not env_evals.ID.fullmatch(parts[1]):
            raise BadRequest(f"{parts[1][:60]!r} is not an env-eval id (envEval- and 8 hex digits)")
        return 200, env_evals.get(parts[1])
    if parts == ["compare"] and method == "GET":
        compared = evaluations.compare_evaluations(_eval_id(query.get("a", "")), _eval_id(query.get("b", "")))
        compared["dashboard"] = dashboard_panels(compared)   # the static dashboard's panels, as data to draw
        return 200, compared
    if len(parts) >= 2 and parts[0] == "runs":
        return _run(method, parts[1], parts[2:], query)
    return 404, {"error": f"no endpoint {method} /api/{'/'.join(parts)[:100]}"}


def _runs(project: str | None, status: str | None) -> list[dict]:
    statuses = sorted(set(run_view.STATUSES) | set(folder_runs.STATUSES))
    if status and status not in statuses:
        raise BadRequest(f"status must be one of {', '.join(statuses)} (got {status[:40]!r})")
    found = [] if project == FOLDER_PROJECT or status == "stopped" else run_view.table(project, status)
    if project in (None, FOLDER_PROJECT):
        found += folder_runs.table(status)
    return found


def _run(method: str, run_id: str, rest: list[str], query: dict[str, str]) -> tuple[int, object]:
    if not RUN_ID.fullmatch(run_id):
        if folder_runs.NAME.fullmatch(run_id):
            return _folder_run(method, run_id, rest, query)
        raise BadRequest(f"{run_id[:60]!r} is not a run id (run- and 8 hex digits, as `strop runs list` shows, "
                         "or the name of a `strop train` folder)")
    what = rest[0] if rest else ""
    if method == "POST" and what in ("cancel", "resume") and len(rest) == 1:
        return 200, (runs.cancel if what == "cancel" else runs.resume)(run_id)
    if method != "GET" or len(rest) > 1:
        return 404, {"error": f"no endpoint {method} /api/runs/{run_id}/{'/'.join(rest)[:60]}"}
    if what == "":
        return 200, run_view.detail(run_id)
    if what == "metrics":
        return 200, {"rows": run_view.metrics(run_id)}
    if what == "log":
        return 200, {"text": tail(run_view.folder(run_id) / "worker.log")}
    if what == "steps":
        return 200, _steps(_index(run_id))
    if what == "rollouts":
        index = _index(run_id)
        page = index.page(rollout_query(query), offset=_int(query, "offset", 0, 0),
                          limit=_int(query, "limit", 40, 1, MAX_PAGE))
        return 200, page
    return 404, {"error": f"no endpoint GET /api/runs/{run_id}/{what[:60]}"}


def _folder_run(method: str, name: str, rest: list[str], query: dict[str, str]) -> tuple[int, object]:
    """A `strop train` folder run: the same endpoints, read from its folder; no cancel or resume from here."""
    path, what = folder_runs.folder(name), (rest[0] if rest else "")
    if method == "POST" and what in ("cancel", "resume"):
        raise StropError(f"{name} is a `strop train` run, not a background one: stop it with Ctrl-C where it runs; "
                         f"resume it with `strop train ... --run-dir {path}`")
    if method != "GET" or len(rest) > 1:
        return 404, {"error": f"no endpoint {method} /api/runs/{name}/{'/'.join(rest)[:60]}"}
    index = index_for(path / "rollouts.jsonl", strop_home() / "ui-cache" / f"folder-{name}.rollouts-index")
    answers = {"": lambda: folder_runs.detail(name), "metrics": lambda: {"rows": folder_runs.metrics(name)},
               "log": lambda: {"text": tail(path / "worker.log")},
               "steps": lambda: _steps(index),
               "rollouts": lambda: index.page(rollout_query(query), offset=_int(query, "offset", 0, 0),
                                              limit=_int(query, "limit", 40, 1, MAX_PAGE))}
    if what not in answers:
        return 404, {"error": f"no endpoint GET /api/runs/{name}/{what[:60]}"}
    return 200, answers[what]()


def _sample(body: bytes) -> dict:
    try:
        request = json.loads(body or b"{}")
    except ValueError as exc:
        raise BadRequest(f"the body must be a JSON object {{model, prompt, maxTokens, temperature}}: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("model"), str) or not request["model"]:
        raise BadRequest("the body must be a JSON object with model (a modelId or a selected base model) and prompt")
    # lazy: sampling loads torch and a model; the rest of the UI never needs them
    from strop.ui.sample import sample
    return sample(request["model"], request.get("prompt"), max_tokens=request.get("maxTokens", 128),
                  temperature=request.get("temperature", 0.0))


def _steps(index) -> dict:
    index.refresh()
    return {"steps": index.steps_summary(), "rollouts": len(index.offsets)}


def _index(run_id: str):
    # kept under $STROP_HOME, not in the run's folder: that folder is the worker's to write
    cache = strop_home() / "ui-cache" / f"{run_id}.rollouts-index"
    return index_for(run_view.folder(run_id) / "rollouts.jsonl", cache)


def _eval_id(value: str) -> str:
    if not EVAL_ID.fullmatch(value):
        raise BadRequest(f"{value[:60]!r} is not an evaluation id (eval- and 8 hex digits)")
    return value


def rollout_query(query: dict[str, str]) -> RolloutQuery:
    return RolloutQuery(step=_opt_int(query, "step"), group=_opt_int(query, "group"),
                        min_reward=_opt_float(query, "minReward"), max_reward=_opt_float(query, "maxReward"),
                        term=query.get("term") or None, term_min=_opt_float(query, "termMin"),
                        kind=query.get("kind") or None, text=(query.get("q") or "")[:200] or None,
                        errors_only=query.get("errors") in ("1", "true"))


def _models() -> list[dict]:
    found = []
    for model in models.list_all():
        try:
            model["lineage"] = runs.get(model["runId"])["lineage"]
        except StropError:
            model["lineage"] = []
        found.append(model)
    return found


def _opt_int(query: dict, key: str) -> int | None:
    return None if query.get(key) in (None, "") else _int(query, key, 0, -(1 << 62))


def _int(query: dict, key: str, default: int, low: int, high: int = 1 << 62) -> int:
    raw = query.get(key)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{key} must be a whole number (got {raw[:40]!r})") from None
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low} and {high} (got {value})")
    return value


def _opt_float(query: dict, key: str) -> float | None:
    raw = query.get(key)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{key} must be a number (got {raw[:40]!r})") from None
    if not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number (got {raw[:40]!r})")
    return value


def finite(value):
    """NaN and infinities as null: JSON has no such numbers and a browser's JSON.parse refuses them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
