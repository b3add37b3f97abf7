"""Training on chosen tasks of an environment: its `"tasks"` are the ids to draw from, given as a list or as the
JSON-lines file `strop envs eval ENV --samples K --pool-out FILE` writes (the RL pool: tasks the model solved
between 1 and K-1 times of K, the only ones on which a group of K episodes has an advantage to learn from).

    environment = {"name": "finance-sql", "split": "train", "tasks": "pool.jsonl"}

A run reads the file once and keeps the ids in its config.json, so a resumed or repeated run draws from the same
tasks whatever happens to the file after.
"""

from __future__ import annotations

import json
from pathlib import Path

from strop.envs.base import Task
from strop.errors import StropError

MAX_POOL_BYTES = 64 * 1024 * 1024  # a pool file is a line per task: far more than any split holds


def tasks_problem(tasks) -> str | None:
    """Why `tasks` cannot name a pool (a path to a file that exists, or a non-empty list of id strings), or None."""
    if isinstance(tasks, str):
        path = Path(tasks)
        if not path.is_file():
            return f"{tasks[:200]!r} is not a file; give the JSON-lines file `strop envs eval --pool-out` wrote, " \
                   "or a list of task ids"
        return None
    if isinstance(tasks, list) and tasks and all(isinstance(t, str) and t for t in tasks):
        return None
    return f"must be a pool file's path or a non-empty list of task ids, got {repr(tasks)[:200]}"


def pool_ids(tasks: str | list[str]) -> list[str]:
    """The task ids a pool names, in its order, each once."""
    if isinstance(tasks, list):
        return list(dict.fromkeys(tasks))
    path = Path(tasks)
    if path.stat().st_size > MAX_POOL_BYTES:
        raise StropError(f"{path} is {path.stat().st_size:,} bytes, more than a pool file holds "
                         f"({MAX_POOL_BYTES:,}); is it the file --pool-out wrote?")
    ids = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise StropError(f"{path} line {number} is not JSON ({e.msg}): a pool file has one JSON object a line, "
                             "as `strop envs eval --pool-out` writes it") from None
        if not isinstance(row, dict) or not isinstance(row.get("task"), str):
            raise StropError(f"{path} line {number} has no \"task\" id: a pool file's lines are "
                             '{"task": ID, ...}, as `strop envs eval --pool-out` writes them')
        ids.append(row["task"])
    if not ids:
        raise StropError(f"{path} names no task: the RL pool was empty (no task solved between 1 and K-1 times of "
                         "K); train on the whole split, or sample more times (--samples) to find one")
    return list(dict.fromkeys(ids))


def select(tasks: list[Task], ids: list[str], *, where: str) -> list[Task]:
    """The tasks of `ids`, in the pool's order; an id that is not one of `tasks` is an error naming it (a pool
    written for other options, another split or another environment)."""
    by_id = {t.id: t for t in tasks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise StropError(f"{len(missing)} of the pool's {len(ids)} task ids are not tasks of {where}, e.g. "
                         f"{missing[0][:200]!r}; write the pool with the same environment options and split "
                         "(`strop envs eval ENV --splits train --samples K --pool-out FILE`)")
    return [by_id[i] for i in ids]
