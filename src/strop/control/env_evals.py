"""The reports of `strop envs eval`, kept under $STROP_HOME/env-evals so `strop ui` can show them later.

    envEvalId = env_evals.save(report)          # 'envEval-1a2b3c4d'; report as `strop envs eval` prints it
    env_evals.list_all()                        # newest first: id, env, model, createdAt, pass@1 and rubrics per split
    env_evals.get("envEval-1a2b3c4d")           # the whole report, per-episode lists left out

One JSON file a report; nothing else writes there. Each file is read with a size cap (MAX_BYTES).
"""

from __future__ import annotations

import json
import re
import secrets
import time

from strop.errors import StropError
from strop.paths import strop_home

ID = re.compile(r"envEval-[0-9a-f]{8}")
MAX_BYTES = 32 << 20
MAX_LISTED = 200


def _folder():
    return strop_home() / "env-evals"


def save(report: dict) -> str:
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    env_eval_id = f"envEval-{secrets.token_hex(4)}"
    kept = {"envEvalId": env_eval_id, "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **report}
    (folder / f"{env_eval_id}.json").write_text(json.dumps(kept, default=str), encoding="utf-8")
    return env_eval_id


def _read(path) -> dict:
    if path.stat().st_size > MAX_BYTES:
        raise StropError(f"{path} is over {MAX_BYTES >> 20} MB; it is not an env-eval report strop wrote")
    return json.loads(path.read_text(encoding="utf-8"))


def _brief(report: dict) -> dict:
    """The report without per-episode lists (model output, unbounded): splits, rubrics, headroom, comparison."""
    def splits(r):
        return {name: {k: v for k, v in s.items() if k != "episodes"} for name, s in (r.get("splits") or {}).items()}
    brief = {k: v for k, v in report.items() if k not in ("splits", "baseline")}
    brief["splits"] = splits(report)
    if isinstance(report.get("baseline"), dict):
        brief["baseline"] = {"model": report["baseline"].get("model"), "splits": splits(report["baseline"])}
    return brief


def list_all() -> list[dict]:
    folder = _folder()
    paths = sorted(folder.glob("envEval-*.json"), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
    found = []
    for path in paths[:MAX_LISTED]:
        try:
            found.append(_brief(_read(path)))
        except (OSError, ValueError, StropError):
            continue   # a file being written, or not one of ours: not listed
    return found


def get(env_eval_id: str) -> dict:
    if not ID.fullmatch(env_eval_id):
        raise StropError(f"{env_eval_id[:60]!r} is not an env-eval id (envEval- and 8 hex digits, as "
                         "`strop envs eval` prints it)")
    path = _folder() / f"{env_eval_id}.json"
    if not path.is_file():
        raise StropError(f"no env-eval report {env_eval_id} under {_folder()}")
    return _brief(_read(path))
