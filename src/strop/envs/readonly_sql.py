"""SQL a model writes, run so that it changes nothing and costs bounded time and memory: a SQLite file opened
read-only (`mode=ro`, `PRAGMA query_only`), an authorizer that allows only reads, one SELECT/WITH statement per
call, a progress handler that stops a query past its time limit, results capped in rows and bytes, and SQLite's
slow functions (printf widths, trims) bounded. `format_rows` turns a result into the text a model reads.

    db = ReadOnlyDatabase(path, timeout=2.0)
    result = db.query(single_select("SELECT fiscal_year, revenue FROM income_statement"), row_cap=50)
    format_rows(result.columns, result.rows)
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

class QueryRejected(Exception):
    """A query refused before it ran; the message is shown to the model."""


class QueryTimeout(Exception):
    """A query stopped by the time limit."""


OBSERVATION_CHARS = 16_000   # the most text one tool call shows the model (50 rows of a wide table: ~7,000)
RESULT_BYTES = 1 << 20       # rows fetched past this are dropped, as past row_cap (a row of 64 blobs: 6.4 MB)


_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"}


# Two of SQLite's functions can spin inside one call, where the progress handler (it runs between VM
# instructions) cannot stop them and the length limit does not bound them; a 20,000-character query holds hundreds of
# calls, so one run_sql could hold an environment (or an OpenEnv server) for minutes to hours. SQLite 3.40, here:
# - printf('%.*c', N, 'x') repeats its character N times even past the length limit: 5.3 s for N = 1e9;
# - trim/ltrim/rtrim(X, Y) compare each character of X with each of Y: 2.5 s for 99,000 x 8,000.
# So printf (and its alias format) refuses, with NULL as SQLite's printf answers a result too big, any width or
# precision past the length limit, then formats with SQLite's own printf on a private connection; and the trims
# are strop's, linear in X, where X and Y are text (SQLite's own for the rest, unless it would be slow: NULL).
VALUE_BYTES = 100_000  # SQLITE_LIMIT_LENGTH: no value longer; a width or precision past it could only overflow
# a conversion: flags, width (digits or *), precision, length modifier, type (SQLite's printf grammar)
_PRINTF_SPEC = re.compile(r"%[-+ #0,!]*(\*|\d+)?(?:\.(\*|\d*))?(?:ll|l)?(.)", re.S)
_LEADING_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf(?:inity)?)", re.I)


def _magnitude(value) -> float:
    """How large a number SQLite could read from a printf argument (text and blobs by their leading number); more
    than it reads, never less."""
    if isinstance(value, (int, float)):
        return abs(float(value)) if not (isinstance(value, float) and math.isnan(value)) else 0.0
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    match = _LEADING_NUMBER.match(value) if isinstance(value, str) else None
    return abs(float(match.group(1))) if match else 0.0


def printf_fields_fit(fmt, args: tuple) -> bool:
    """Whether every width and precision of a printf format (digits, or * taken from `args` in SQLite's order)
    is at most VALUE_BYTES."""
    if not isinstance(fmt, (str, bytes)):
        return True
    fmt = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else fmt
    used = 0
    for spec in _PRINTF_SPEC.finditer(fmt):
        for field in (spec.group(1), spec.group(2)):
            if field == "*":
                if used < len(args) and _magnitude(args[used]) > VALUE_BYTES:
                    return False
                used += 1
            elif field and (len(field) > 9 or int(field) > VALUE_BYTES):
                return False
        if spec.group(3) not in "%n":  # every other conversion reads an argument
            used += 1
    return True


class _BoundedFunctions:
    """printf, format and the trims for a connection (see above): SQLite's results, in bounded time."""

    TRIMS = {"trim": (True, True), "ltrim": (True, False), "rtrim": (False, True)}  # (from the left, the right)
    # SQLite's own trim on what is not text on both sides (numbers, blobs), where it stays cheap
    SLOW_TRIM = 10_000_000  # characters of X times characters of Y: ~25 ms

    def __init__(self):
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, VALUE_BYTES)

    def install(self, conn: sqlite3.Connection) -> None:
        for name in ("printf", "format"):
            conn.create_function(name, -1, self.printf, deterministic=True)
        for name in self.TRIMS:
            conn.create_function(name, 1, lambda x, name=name: self.trim(name, x, " "), deterministic=True)
            conn.create_function(name, 2, lambda x, y, name=name: self.trim(name, x, y), deterministic=True)

    def printf(self, *args):
        if not args or not printf_fields_fit(args[0], args[1:]):
            return None
        return self._sqlite("printf", args)

    def trim(self, name: str, text, characters):
        """A set lookup per removed character (Python's str.strip also compares with each of Y's: 0.5 s for
        99,000 x 8,000 four-byte characters)."""
        if isinstance(text, str) and isinstance(characters, str):
            left, right = self.TRIMS[name]
            strip, start, end = set(characters), 0, len(text)
            while left and start < end and text[start] in strip:
                start += 1
            while right and end > start and text[end - 1] in strip:
                end -= 1
            return text[start:end]
        sizes = [len(v) if isinstance(v, (str, bytes)) else 32 for v in (text, characters)]
        return self._sqlite(name, (text, characters)) if sizes[0] * sizes[1] <= self.SLOW_TRIM else None

    def _sqlite(self, name: str, args: tuple):
        return self.conn.execute(f"SELECT {name}({', '.join('?' * len(args))})", args).fetchone()[0]

    def close(self) -> None:
        self.conn.close()


def _authorize(action: int, arg1, arg2, db_name, trigger) -> int:
    # everything not needed to read is denied: writes, schema changes, ATTACH/DETACH, PRAGMA, transactions
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _skip_space_and_comments(sql: str, i: int) -> int:
    while i < len(sql):
        if sql[i].isspace() or sql[i] == ";":
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = len(sql) if end < 0 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = len(sql) if end < 0 else end + 2
        else:
            break
    return i


def single_select(sql: str) -> str:
    """The one SELECT (or WITH) statement in `sql`, without a trailing semicolon; QueryRejected otherwise.

    Scans quotes ('', "", ``, []) and comments so that a ';' inside them does not end the statement."""
    start = _skip_space_and_comments(sql, 0)
    keyword = re.match(r"[A-Za-z_]+", sql[start:])
    if not keyword or keyword.group().lower() not in ("select", "with"):
        first = keyword.group().upper() if keyword else sql[start:start + 12].strip() or "nothing"
        raise QueryRejected(f"only read-only SELECT (or WITH ... SELECT) queries are allowed; this query starts "
                            f"with {first!r}.")
    i, n = start, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`[":
            end = sql.find("]" if ch == "[" else ch, i + 1)  # a doubled quote reads as close + reopen
            i = n if end < 0 else end + 1
        elif sql.startswith("--", i) or sql.startswith("/*", i):
            i = _skip_space_and_comments(sql, i)
        elif ch == ";":
            if _skip_space_and_comments(sql, i) < n:
                raise QueryRejected("only one SQL statement per call; send the first query alone.")
            return sql[start:i]
        else:
            i += 1
    return sql[start:]


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more rows than the cap, or than RESULT_BYTES holds


class ReadOnlyDatabase:
    """A SQLite file opened so that no statement can change it, with a time limit per query."""

    def __init__(self, path: str | Path, timeout: float):
        self.path, self.timeout = Path(path), timeout
        self.conn = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA query_only = ON")  # before the authorizer, which denies every PRAGMA
        # a value's length and a result's columns are SQLite's to bound: a single row of 2,000 randomblob(1e6)
        # columns would otherwise be 2 GB before Python sees it
        for limit, value in ((sqlite3.SQLITE_LIMIT_ATTACHED, 0), (sqlite3.SQLITE_LIMIT_LENGTH, VALUE_BYTES),
                             (sqlite3.SQLITE_LIMIT_SQL_LENGTH, 20_000), (sqlite3.SQLITE_LIMIT_COLUMN, 64)):
            self.conn.setlimit(limit, value)
        self._functions = _BoundedFunctions()
        self._functions.install(self.conn)
        self.conn.set_authorizer(_authorize)
        self.conn.set_progress_handler(self._progress, 1000)
        self._deadline: float | None = None
        self._timed_out = False

    def _progress(self) -> int:
        if self._deadline is not None and time.monotonic() > self._deadline:
            self._timed_out = True
            return 1  # non-zero aborts the statement ("interrupted")
        return 0

    def query(self, sql: str, row_cap: int, params: tuple = ()) -> QueryResult:
        """Run one SELECT; QueryRejected, QueryTimeout or sqlite3.Error when it cannot."""
        if len(sql) > 20_000:
            raise QueryRejected(f"the query is {len(sql)} characters long; the limit is 20000.")
        statement = single_select(sql)
        self._deadline, self._timed_out = time.monotonic() + self.timeout, False
        cursor = None
        try:
            cursor = self.conn.execute(statement, params)
            columns = [d[0] for d in cursor.description or ()]
            rows, size, truncated = [], 0, False
            while (row := cursor.fetchone()) is not None:
                if len(rows) == row_cap or size > RESULT_BYTES:
                    truncated = True
                    break
                rows.append(row)
                size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
        except sqlite3.OperationalError:
            if self._timed_out:
                raise QueryTimeout() from None
            raise
        finally:
            self._deadline = None
            if cursor is not None:
                cursor.close()  # resets a statement left part-way through its rows
        return QueryResult(columns, rows, truncated)

    def close(self) -> None:
        self.conn.close()
        self._functions.close()


def cell_text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.12g}"
    if isinstance(value, bytes):
        return f"x'{value[:32].hex()}{'...' if len(value) > 32 else ''}'"
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= 200 else text[:200] + "..."


def format_rows(columns: list[str], rows: list[tuple], limit: int = OBSERVATION_CHARS) -> str:
    """Header and rows, pipe-separated: what a small model reads most reliably. Past `limit` characters the
    text is cut, with a line saying so."""
    lines, size = [], 0
    for line in ([" | ".join(cell_text(c) for c in columns)] + [" | ".join(cell_text(v) for v in row) for row in rows]):
        if size + len(line) > limit:
            shown = max(0, len(lines) - 1)
            lines.append(f"[output truncated at {limit} characters: {shown} of {len(rows)} rows shown; select fewer "
                         "columns, or shorter values]")
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)
