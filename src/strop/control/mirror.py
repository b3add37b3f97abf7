"""The store's copy of a run, read from the files its loop writes: each metrics.jsonl row becomes a RunStep and
each finished checkpoint (a folder with a manifest) a Checkpoint row. The loop knows nothing of the store.

    mirror = RunMirror(run_id, folder)
    with mirror.following(every=1.0):      # a thread syncs while the run trains
        run_grpo(config, folder)
    mirror.sync()                          # and once more at the end

The files are the truth. A resumed run cuts metrics.jsonl back to its checkpoint, so rows the store holds past
the file's last step are deleted, and with them checkpoints newer than the step after it. Reading is
incremental: new complete lines only, from where the last sync stopped, unless the file was replaced (a resume
rewrites it) or shrank, when it is read whole and the store reconciled with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Iterator

from sqlalchemy import delete, select

from strop.rl.checkpoints import MANIFEST, sha256_file
from strop.store import open_store, session_scope
from strop.store.schema import Checkpoint, Run, RunStep


class RunMirror:
    def __init__(self, run_id: str, folder: str | Path):
        self.run_id, self.folder = run_id, Path(folder)
        self._file: tuple[int, int] | None = None   # (inode, bytes read) of metrics.jsonl
        self._lock = threading.Lock()

    def sync(self) -> None:
        """Bring the store up to the files (safe to call from several threads; one sync runs at a time)."""
        with self._lock:
            finished = self._checkpoints()   # before the metrics: checkpoint k is written after row k-1
            rows, whole = self._new_rows()
            with session_scope(open_store()) as s:
                stored = set(s.scalars(select(RunStep.step).where(RunStep.run_id == self.run_id)))
                if whole:
                    gone = stored - set(rows)
                    if gone:
                        s.execute(delete(RunStep).where(RunStep.run_id == self.run_id, RunStep.step.in_(gone)))
                    stored -= gone
                for step in sorted(set(rows) - stored):
                    s.add(RunStep(run_id=self.run_id, step=step,
                                  metrics={k: v for k, v in rows[step].items() if k != "step"}))
                s.flush()
                last = s.scalar(select(RunStep.step).where(RunStep.run_id == self.run_id)
                                .order_by(RunStep.step.desc()).limit(1))
                done = -1 if last is None else last
                s.execute(delete(Checkpoint).where(Checkpoint.run_id == self.run_id, Checkpoint.step > done + 1))
                have = set(s.scalars(select(Checkpoint.step).where(Checkpoint.run_id == self.run_id)))
                for step, path in sorted(finished.items()):
                    if step not in have and step <= done + 1:
                        s.add(Checkpoint(run_id=self.run_id, step=step, path=str(path),
                                         manifest_sha256=sha256_file(path / MANIFEST)))
                s.get(Run, self.run_id).current_step = done + 1

    @contextlib.contextmanager
    def following(self, every: float = 1.0) -> Iterator[RunMirror]:
        """Sync every `every` seconds in a background thread while the block runs."""
        stop = threading.Event()

        def loop():
            while not stop.wait(every):
                try:
                    self.sync()
                except Exception as exc:  # noqa: BLE001 - a busy store must not stop training; the next sync retries
                    print(f"warning: could not mirror the run into the store: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=loop, name=f"mirror-{self.run_id}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def _checkpoints(self) -> dict[int, Path]:
        folder = self.folder / "checkpoints"
        found = {}
        for path in folder.glob("step-*") if folder.is_dir() else ():
            try:
                manifest = json.loads((path / MANIFEST).read_text())
                found[int(manifest["step"])] = path
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not finished yet (or torn by a crash: the loop skips it too)
        return found

    def _new_rows(self) -> tuple[dict[int, dict], bool]:
        """{step: row} of the complete lines not read before, and whether this was a whole reading."""
        path = self.folder / "metrics.jsonl"
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            whole, self._file = True, None
            return {}, whole
        with handle:
            inode, size = os.fstat(handle.fileno()).st_ino, os.fstat(handle.fileno()).st_size
            whole = self._file is None or self._file[0] != inode or size < self._file[1]
            start = 0 if whole else self._file[1]
            handle.seek(start)
            data = handle.read()
        complete = data[:data.rfind(b"\n") + 1]   # a line still being written waits for the next sync
        self._file = (inode, start + len(complete))
        rows = {}
        for line in complete.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows[row["step"]] = row
        return rows, whole
