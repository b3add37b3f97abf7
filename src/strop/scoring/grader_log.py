"""A grader worker's standard error, kept in a host file with bounds: a grader that prints without end fills no disk.

The pool reads the worker's stderr through a pipe, on a thread of this class, and keeps at most `per_request`
bytes of it for each request (an import or a call), then a line saying how much it dropped; the file itself
never grows past `total` bytes (older output is cleared, with a line saying so), so a long run stays bounded.

    log = BoundedLog(path)             # log.fd: the pipe's write end, for Popen(stderr=...)
    log.next_request()                 # before each request: a fresh allowance
    log.tail(400)                      # what the worker wrote last (its death, say)
    log.close()
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PER_REQUEST = 64 * 1024
TOTAL = 4 * 1024 * 1024
CHUNK = 1 << 16


class BoundedLog:
    def __init__(self, path: Path, *, per_request: int = PER_REQUEST, total: int = TOTAL):
        self.path, self.per_request, self.total = path, per_request, total
        self.file = open(path, "wb", buffering=0)  # unbuffered: what a reader of the file sees is all there is
        self._read, self.fd = os.pipe()
        self._lock = threading.Lock()
        self.kept = self.dropped = 0
        self._thread = threading.Thread(target=self._drain, name=f"grader-log-{path.name}", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The worker holds the write end now: close ours, so the pipe ends when the worker's processes do."""
        os.close(self.fd)
        self.fd = -1

    def next_request(self) -> None:
        with self._lock:
            self._note_dropped()
            self.kept = 0

    def tail(self, size: int) -> bytes:
        """The last `size` bytes written, once the worker's side has closed (a dead worker: at once)."""
        self._thread.join(timeout=2.0)
        return self.path.read_bytes()[-size:]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._thread.join(timeout=2.0)  # the worker is dead: the pipe's end is near
        with self._lock:
            self._note_dropped()
            self.file.close()

    def _drain(self) -> None:
        try:
            while True:
                chunk = os.read(self._read, CHUNK)
                if not chunk:
                    return
                with self._lock:
                    if self.file.closed:
                        return
                    room = max(0, self.per_request - self.kept)
                    self._write(chunk[:room])
                    self.kept += min(room, len(chunk))
                    self.dropped += len(chunk) - min(room, len(chunk))
        finally:
            os.close(self._read)

    def _note_dropped(self) -> None:
        if self.dropped and not self.file.closed:
            self._write(f"\n[strop: {self.dropped} more bytes of the grader's output were dropped; "
                        f"{self.per_request} are kept per call]\n".encode())
        self.dropped = 0

    def _write(self, data: bytes) -> None:
        if self.file.tell() + len(data) > self.total:
            self.file.seek(0)
            self.file.truncate()
            self.file.write(f"[strop: earlier output cleared; this log keeps at most {self.total} bytes]\n".encode())
        self.file.write(data)
