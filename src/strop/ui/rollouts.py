"""Pages of a run's rollouts.jsonl without reading the file whole: a byte-offset index built once per file.

The index keeps, per line, its offset and length and the three fields the browser pages by (step, group,
reward), in flat arrays: about 30 bytes a rollout, so 100,000 rollouts cost 3 MB however long their text. The
loop appends to the file as it trains, so a later look only indexes the new bytes; a resumed run cuts the file
back (it shrinks, or its first bytes change) and the index is built again. A large index is kept on disk
(`cache`), so it is built once, not once per server.

    index = RolloutIndex(run_folder / "rollouts.jsonl")
    page = index.page(RolloutQuery(step=12), offset=0, limit=40)   # {'rows': [...], 'matched': 64, ...}

A filter on text, a term or the kind of task has to read lines; it reads at most SCAN_LIMIT of them a request
and says where it stopped (`scannedTo`), so a hostile or huge file costs bounded time.
"""

from __future__ import annotations

import json
import os
import re
import threading
from array import array
from dataclasses import dataclass
from pathlib import Path

# the loop writes step, group, reward first (strop.rl.step); a line of another shape is parsed whole
_HEAD = re.compile(rb'\{"step": (-?\d+), "group": (-?\d+), "reward": (-?[0-9.eE+-]+|NaN|null)[,}]')
MAX_LINE = 4 << 20          # a line longer than this is shown as a note, not parsed
SCAN_LIMIT = 20_000         # lines a content filter reads per request
MAX_PAGE = 200
SAVE_AFTER = 5_000          # rows indexed in one look that are worth keeping on disk
CACHE_VERSION = 1
_HEAD_BYTES = 4096


@dataclass(frozen=True)
class RolloutQuery:
    """What to show; None is no filter. `text` matches anywhere in the line (case-insensitive)."""
    step: int | None = None
    group: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    term: str | None = None          # keep rollouts whose score `term` is at least term_min
    term_min: float | None = None
    kind: str | None = None          # a task id prefix or the row's info.kind
    text: str | None = None
    errors_only: bool = False

    def needs_content(self) -> bool:
        return bool(self.term or self.kind or self.text or self.errors_only)


class RolloutIndex:
    def __init__(self, path: Path, cache: Path | None = None):
        self.path, self.cache = Path(path), cache
        self._lock = threading.Lock()
        self._reset()
        if cache is not None:
            self._load_cache()

    def _reset(self) -> None:
        self.offsets, self.lengths = array("q"), array("l")
        self.steps, self.groups, self.rewards = array("l"), array("l"), array("d")
        self.indexed_to, self.first_bytes = 0, b""

    def refresh(self) -> None:
        """Index the bytes appended since the last look (all of them after a cut-back)."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                self._reset()
                return
            with open(self.path, "rb") as f:
                head = f.read(64)
                if size < self.indexed_to or (self.first_bytes and head[:len(self.first_bytes)] != self.first_bytes):
                    self._reset()
                self.first_bytes = self.first_bytes or head
                f.seek(self.indexed_to)
                before = len(self.offsets)
                self._index_from(f)
            if self.cache is not None and len(self.offsets) - before >= SAVE_AFTER:
                self._save_cache()

    # The cache: a JSON header line, then the five arrays' bytes. A later server (or a restart) reads it in
    # milliseconds and indexes only what was appended since; one that does not fit the file is ignored.
    def _save_cache(self) -> None:
        arrays = (self.offsets, self.lengths, self.steps, self.groups, self.rewards)
        header = {"version": CACHE_VERSION, "indexedTo": self.indexed_to, "firstBytes": self.first_bytes.hex(),
                  "count": len(self.offsets), "itemsizes": [a.itemsize for a in arrays]}
        try:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            partial = self.cache.with_name(self.cache.name + ".partial")
            with open(partial, "wb") as f:
                f.write(json.dumps(header).encode() + b"\n")
                for a in arrays:
                    a.tofile(f)
            os.replace(partial, self.cache)
        except OSError:
            pass            # no cache is only slower: the next server builds the index again

    def _load_cache(self) -> None:
        try:
            with open(self.cache, "rb") as f:
                header = json.loads(f.readline(4096))
                arrays = (array("q"), array("l"), array("l"), array("l"), array("d"))
                if header.get("version") != CACHE_VERSION or header["itemsizes"] != [a.itemsize for a in arrays]:
                    return
                for a in arrays:
                    a.fromfile(f, header["count"])
            with open(self.path, "rb") as f:
                head = f.read(64)
            first = bytes.fromhex(header["firstBytes"])
            if self.path.stat().st_size < header["indexedTo"] or head[:len(first)] != first:
                return      # cut back or replaced since: built again
        except (OSError, ValueError, KeyError, TypeError, EOFError):
            return
        self.offsets, self.lengths, self.steps, self.groups, self.rewards = arrays
        self.indexed_to, self.first_bytes = header["indexedTo"], first

    def _index_from(self, f) -> None:
        at, limit, head_match = self.indexed_to, MAX_LINE + 1, _HEAD.match
        # bound once: this loop runs once a rollout, 100,000 times for a large run
        offsets, lengths, steps, groups, rewards = (self.offsets.append, self.lengths.append, self.steps.append,
                                                    self.groups.append, self.rewards.append)
        while True:
            line = f.readline(limit)     # never more than that in memory, however long the line
            length = len(line)
            if not line.endswith(b"\n"):
                if length <= MAX_LINE:    # the end of the file, or a line being written: the next look
                    break
                length = _skip_rest(f, length)
                if length is None:
                    break
            match = head_match(line, 0, _HEAD_BYTES)
            raw = match.groups() if match else None
            if raw and raw[2] not in (b"NaN", b"null"):
                step, group, reward = int(raw[0]), int(raw[1]), float(raw[2])
            else:
                step, group, reward = _head(line[:_HEAD_BYTES] if length > MAX_LINE else line, length)
            if step is not None:
                offsets(at)
                lengths(length)
                steps(step)
                groups(group)
                rewards(reward)
            at += length
        self.indexed_to = at

    def steps_summary(self) -> list[dict]:
        """[{step, rollouts, groups}] in step order."""
        counts: dict[int, list] = {}
        for step, group in zip(self.steps, self.groups):
            entry = counts.setdefault(step, [0, set()])
            entry[0] += 1
            entry[1].add(group)
        return [{"step": s, "rollouts": n, "groups": len(g)} for s, (n, g) in sorted(counts.items())]

    def page(self, query: RolloutQuery, *, offset: int = 0, limit: int = 40) -> dict:
        self.refresh()
        limit = max(1, min(limit, MAX_PAGE))
        candidates = [i for i in range(len(self.offsets)) if self._index_matches(i, query)]
        if not query.needs_content():
            chosen = candidates[offset:offset + limit]
            rows = [self._read(i) for i in chosen]
            return {"rows": rows, "matched": len(candidates), "offset": offset, "complete": True,
                    "total": len(self.offsets)}
        return self._scan(candidates, query, offset, limit)

    def _scan(self, candidates: list[int], query: RolloutQuery, offset: int, limit: int) -> dict:
        """Content filters: read candidates from `offset` on (an offset into the candidates) until `limit`
        match or SCAN_LIMIT were read."""
        rows, at = [], offset
        needle = query.text.lower() if query.text else None
        while at < len(candidates) and len(rows) < limit and at - offset < SCAN_LIMIT:
            row = self._read(candidates[at])
            at += 1
            if _content_matches(row, query, needle):
                rows.append(row)
        return {"rows": rows, "matched": None, "offset": offset, "next": at if at < len(candidates) else None,
                "complete": at >= len(candidates), "scannedTo": at, "candidates": len(candidates),
                "total": len(self.offsets)}

    def _index_matches(self, i: int, q: RolloutQuery) -> bool:
        if q.step is not None and self.steps[i] != q.step:
            return False
        if q.group is not None and self.groups[i] != q.group:
            return False
        reward = self.rewards[i]
        if q.min_reward is not None and not reward >= q.min_reward:
            return False
        return q.max_reward is None or reward <= q.max_reward

    def _read(self, i: int) -> dict:
        length = self.lengths[i]
        with open(self.path, "rb") as f:
            f.seek(self.offsets[i])
            if length > MAX_LINE:
                data = f.read(_HEAD_BYTES)
                return {"step": self.steps[i], "group": self.groups[i], "reward": self.rewards[i], "line": i,
                        "tooLarge": f"this rollout's line is {length:,} bytes, over the {MAX_LINE:,} shown; read it "
                                    f"from {self.path} at byte {self.offsets[i]}",
                        "head": data.decode("utf-8", "replace")}
            data = f.read(length)
        try:
            row = json.loads(data)
        except ValueError as exc:
            return {"step": self.steps[i], "group": self.groups[i], "reward": self.rewards[i], "line": i,
                    "unreadable": f"not JSON: {exc}"}
        row = row if isinstance(row, dict) else {"value": row}
        row["line"] = i
        return row


def _skip_rest(f, length: int) -> int | None:
    """Read past the rest of an over-long line in 1 MB pieces; its whole length, or None when it has no end yet."""
    while True:
        piece = f.readline(1 << 20)
        if not piece:
            return None
        length += len(piece)
        if piece.endswith(b"\n"):
            return length


def _head(line: bytes, length: int) -> tuple[int | None, int, float]:
    match = _HEAD.match(line, 0, min(len(line), _HEAD_BYTES))
    if match:
        raw = match.group(3)
        return int(match.group(1)), int(match.group(2)), float("nan") if raw in (b"NaN", b"null") else float(raw)
    if length > MAX_LINE:
        return None, 0, 0.0
    try:
        row = json.loads(line)
        step, group, reward = row["step"], row.get("group", 0), row.get("reward")
        return int(step), int(group), float(reward) if isinstance(reward, (int, float)) else float("nan")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, 0, 0.0      # not a rollout (a torn or foreign line): not shown


def _content_matches(row: dict, q: RolloutQuery, needle: str | None) -> bool:
    if q.errors_only and not row.get("errors"):
        return False
    if q.term:
        score = (row.get("scores") or {}).get(q.term) if isinstance(row.get("scores"), dict) else None
        if not isinstance(score, (int, float)) or (q.term_min is not None and score < q.term_min):
            return False
    if q.kind and not _kind_matches(row, q.kind):
        return False
    return needle is None or needle in json.dumps(row, ensure_ascii=False).lower()


def _kind_matches(row: dict, kind: str) -> bool:
    info = row.get("info") if isinstance(row.get("info"), dict) else {}
    values = [str(info.get("kind", "")), str(row.get("task", "")), str(row.get("kind", ""))]
    return any(v == kind or v.startswith(kind + "-") or v.startswith(kind + ":") for v in values)


_INDEXES: dict[Path, RolloutIndex] = {}
_INDEXES_LOCK = threading.Lock()


def index_for(path: Path, cache: Path | None = None) -> RolloutIndex:
    """The one index of `path` in this process (read from `cache` or built on first use, extended after)."""
    with _INDEXES_LOCK:
        if path not in _INDEXES:
            _INDEXES[path] = RolloutIndex(path, cache)
        return _INDEXES[path]
