"""One tracker in a thread of its own, behind a bounded queue: the training loop hands it work and goes on.

The loop's `submit` never waits: when the queue is full (a slow or hung backend) the update is dropped and
counted. The first exception a tracker raises is reported once (`report`: a line on stderr, the worker's log
for a background run) and the tracker gets nothing more; `close` waits at most FINISH_SECONDS for what is
queued and for the backend to finish, then leaves a hung backend behind (a daemon thread) and says so.

    tracker = Background(MlflowTracker(), run, report=print_to_stderr)
    tracker.submit("log_metrics", 3, {"reward": 0.5})
    status = tracker.close()   # {"sent": 1, "dropped": 0, "error": None, "finished": True}
"""

from __future__ import annotations

import queue
import sys
import threading

from strop.trackers.base import RunInfo, Tracker

QUEUE_SIZE = 256        # updates waiting for a slow backend; one a step and a table every few, so minutes of steps
FINISH_SECONDS = 30.0   # the most a run's end waits for a tracker to send what is queued and close


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Background:
    def __init__(self, tracker: Tracker, run: RunInfo, *, report=print_to_stderr, capacity: int = QUEUE_SIZE):
        self.tracker, self.run, self.report = tracker, run, report
        self.sent = self.dropped = 0
        self.error: str | None = None
        self.finished = False
        self._queue: queue.Queue = queue.Queue(maxsize=capacity)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name=f"strop-tracker-{tracker.name}", daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self.tracker.name

    def submit(self, method: str, *args) -> None:
        """Queue `tracker.<method>(*args)`; never blocks (a full queue or a failed tracker drops and counts)."""
        if self.error is not None or self._closing.is_set():
            self.dropped += 1
            return
        try:
            self._queue.put_nowait((method, args))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float | None = None) -> dict:
        """Let the thread send what is queued and finish, waiting at most `timeout` seconds (FINISH_SECONDS)."""
        self._closing.set()
        self._thread.join(FINISH_SECONDS if timeout is None else timeout)
        if self._thread.is_alive() and self.error is None:
            unsent = self._queue.qsize()
            self._fail(f"did not finish within {FINISH_SECONDS if timeout is None else timeout:g} s (its backend "
                       f"is slow or gone); {unsent} queued update{'s' if unsent != 1 else ''} not sent")
        return self.status()

    def status(self) -> dict:
        return {"sent": self.sent, "dropped": self.dropped + (self._queue.qsize() if self.error else 0),
                "error": self.error, "finished": self.finished}

    def _work(self) -> None:
        if not self._call("start", (self.run,)):
            return
        while True:
            try:
                method, args = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._closing.is_set():
                    break
                continue
            if not self._call(method, args):
                return
            self.sent += 1
        if self._call("finish", ()):
            self.finished = True

    def _call(self, method: str, args: tuple) -> bool:
        try:
            getattr(self.tracker, method)(*args)
            return True
        except Exception as exc:  # any failure of a backend is the tracker's, never the run's
            where = f" at step {args[0]}" if method == "log_metrics" else f" in {method}"
            self._fail(f"failed{where}: {type(exc).__name__}: {str(exc)[:300]}")
            return False

    def _fail(self, what: str) -> None:
        if self.error is not None:
            return
        self.error = what
        self.report(f"strop: the {self.name} tracker {what}; training goes on without it (the run folder's "
                    "trackers.json has its counts)")
