"""trackio (pip install -e ".[trackio]"): a local-first tracker; runs go to TRACKIO_DIR's SQLite store
(default ~/.cache/huggingface/trackio), project TRACKIO_PROJECT (default strop), and `trackio show` opens
them. A step's sample rollouts are a trackio.Table named `rollouts`."""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from strop.trackers.base import RolloutTable, RunInfo

# trackio prints its progress to stdout; `strop train --json` keeps stdout for its one JSON answer. Each
# trackio thread moves it to stderr for the call, one thread at a time (sys.stdout is the process's).
_STDOUT = threading.Lock()


@contextlib.contextmanager
def _stdout_to_stderr():
    with _STDOUT, contextlib.redirect_stdout(sys.stderr):
        yield


class TrackioTracker:
    name = "trackio"

    def start(self, run: RunInfo) -> None:
        import trackio  # the extra: checked installed before the run started
        self._trackio = trackio
        with _stdout_to_stderr():
            # no CPU or GPU sampling threads of its own: the run's time is for training
            self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT") or run.project, name=run.name,
                                    config=run.config, embed=False, auto_log_cpu=False, auto_log_gpu=False)

    def log_metrics(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def log_rollouts(self, table: RolloutTable) -> None:
        rows = [dict(zip(table.columns, row)) for row in table.rows]
        self.run.log({"rollouts": self._trackio.Table(data=rows)}, step=table.step)

    def finish(self) -> None:
        with _stdout_to_stderr():
            self.run.finish()
