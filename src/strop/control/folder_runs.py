"""Runs that `strop train` and `strop sft` made straight into a folder of $STROP_HOME/runs, with no store record:
what `strop ui` shows of them, read from the folder alone (config.json, metrics.jsonl, checkpoints/, final/).

    folder_runs.table()                          # [{'runId': '20261203-183839-strop--tiny-random', ...}]
    folder_runs.detail("20261203-183839-strop--tiny-random")

Their status is what the folder says: `succeeded` once final/ holds the adapter, `running` while metrics.jsonl
changed in the last RUNNING_WITHIN seconds, `stopped` otherwise (`strop train --run-dir FOLDER` resumes it).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from strop.control.run_view import last_metrics, metrics_file, tail
from strop.errors import StropError
from strop.paths import runs_dir
from strop.rl.checkpoints import MANIFEST

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
STORE_ID = re.compile(r"run-[0-9a-f]{8}")
RUNNING_WITHIN = 120
MAX_FOLDERS = 500
STATUSES = ("running", "stopped", "succeeded")
PROJECT = "(strop train)"       # what the runs table shows as their project


def known(name: str) -> bool:
    """Whether `name` is a folder run: a plain folder name (never a path) under runs/ with a config.json."""
    return bool(NAME.fullmatch(name)) and not STORE_ID.fullmatch(name) and (runs_dir() / name / "config.json").is_file()


def folder(name: str) -> Path:
    if not known(name):
        raise StropError(f"no run {name[:80]!r}: neither in the store (`strop runs list`) nor a folder with a "
                         f"config.json in {runs_dir()}")
    return runs_dir() / name


def _config(path: Path) -> dict:
    try:
        config = json.loads(tail(path / "config.json", 1 << 20) or "{}")
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _row(path: Path) -> dict:
    config, last = _config(path), last_metrics(path)
    metrics = path / "metrics.jsonl"
    changed = metrics.stat().st_mtime if metrics.exists() else path.stat().st_mtime
    if (path / "final").is_dir():
        status = "succeeded"
    else:
        status = "running" if time.time() - changed < RUNNING_WITHIN else "stopped"
    started = (path / "config.json").stat().st_mtime
    return {"runId": path.name, "project": PROJECT, "configName": None, "status": status,
            "step": int(last["step"]) + 1 if last else 0, "maxSteps": config.get("max_steps"),
            "steps": config.get("max_steps"), "method": "grpo" if "reward_terms" in config else "sft",
            "baseModel": config.get("base_model"), "modelId": None,
            "lineage": [{"baseModel": config.get("base_model")}], "seconds": round(max(0.0, changed - started), 1),
            "reward": last.get("reward") if last else None, "error": None, "folderRun": True}


def table(status: str | None = None) -> list[dict]:
    """The newest MAX_FOLDERS folder runs, newest first."""
    folders = [p for p in runs_dir().iterdir() if known(p.name)]
    folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    rows = [_row(p) for p in folders[:MAX_FOLDERS]]
    return [r for r in rows if not status or r["status"] == status]


def detail(name: str) -> dict:
    path = folder(name)
    info = _row(path)
    info["descriptor"], info["pinned"] = _config(path), None
    info["checkpoints"] = []
    for step_dir in sorted((path / "checkpoints").glob("step-*")) if (path / "checkpoints").is_dir() else ():
        try:
            manifest = json.loads((step_dir / MANIFEST).read_text())
            info["checkpoints"].append({"step": int(manifest["step"]), "path": str(step_dir),
                                        "manifestSha256": None, "createdAt": None})
        except (OSError, ValueError, KeyError, TypeError):
            continue        # not finished (or torn by a crash)
    info["last"], info["runDir"] = last_metrics(path), str(path)
    return info


def metrics(name: str) -> list[dict]:
    return metrics_file(folder(name) / "metrics.jsonl") or []
