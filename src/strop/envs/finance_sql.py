"""finance-sql: answer a question about a synthetic company's financial statements by querying its SQLite database.

    env = FinanceSQLEnv(seed=0)
    task = env.tasks("train")[1]  # "By what percentage did Fairhaven Energy Inc.'s revenue grow from fiscal 2021 ..."
    env.reset(task)
    env.step(ToolCall("list_tables", {}))       # company, income_statement, balance_sheet, cash_flow, segment_revenue
    env.step(ToolCall("run_sql", {"query": "SELECT fiscal_year, revenue FROM income_statement"}))
    env.step(ToolCall("submit_answer", {"answer": "22.49%"})).reward  # 1.1 = correct + format term

The skill being trained is tool-use discipline more than arithmetic: discover the tables before querying, read
SQL errors and fix the query, answer only with a number the data supports. So errors come back as observations
that say how to recover (the valid columns, the valid tables), and `state()` counts the behaviours the rubrics
read (tables listed before the first query, invented tables and columns, errors, recoveries).

The model's SQL never changes anything: the file is opened read-only (`mode=ro`) with `PRAGMA query_only`, an
authorizer allows only reads, one SELECT/WITH statement is run per call, a progress handler stops a query after
`query_timeout` seconds, and results are capped at `row_cap` rows. Whatever the query, what it costs and what the
model reads are bounded: at most 64 columns and 100 kB a value (SQLite's own limits), 1 MB of rows fetched, and
OBSERVATION_CHARS characters of text, cut with a note saying so. The data and questions: `finance_data`.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import sqlite3
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strop.envs import finance_data as data
from strop.envs.base import Observation, StepResult, Task, ToolCall
from strop.errors import StropError

# --- answers and rewards ---------------------------------------------------------------------------------

# Each \s* follows a sign or currency it belongs to, so a run of spaces can be matched one way only: with three
# optional groups each followed by a bare \s*, 400 spaces and an `x` took ~51 s (the splits of the run, at every
# start). Answers are also stripped and cut to ANSWER_CHARS before they are matched.
_NUMBER = re.compile(r"""
    (?:(?P<sign>[-+\u2212\u2013(])\s*)?
    (?:(?P<currency>US\$|\$|USD\b)\s*)?
    (?:(?P<sign2>[-+\u2212])\s*)?
    (?P<digits>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)
    (?:[eE](?P<exponent>[-+]?\d+))?
    (?:\s*(?P<unit>%|percentage\s+points?\b|per\s?cent\b|pp\b|billions?\b|bn\b|b\b|millions?\b|mn\b|mm\b|m\b
                    |thousands?\b|k\b))?
    """, re.IGNORECASE | re.VERBOSE)
_CLOSING = re.compile(r"\s*\)")
ANSWER_CHARS = 1000  # an answer is a number and a few words; characters past this are not read
_SCALE = {"b": 1000.0, "bn": 1000.0, "billion": 1000.0, "billions": 1000.0, "thousand": 0.001,
          "thousands": 0.001, "k": 0.001}  # answers are in USD millions; anything else is 1


@dataclass(frozen=True)
class ParsedAnswer:
    value: float    # in the question's unit: USD millions, percent points or a plain number
    percent: bool   # written with %, "percent" or "pp"


def parse_answer(answer: Any) -> ParsedAnswer | None:
    """The number in a submitted answer: "12.5", "12.5%", "$1,234.5", "1,234.5 million", "USD 1.2bn" (-> 1200),
    "(3.4)" (-> -3.4). With several numbers the first one that is not a bare year counts. Only the first
    ANSWER_CHARS characters (after surrounding space) are read; an infinite number is no number."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        try:
            value = float(answer)
        except OverflowError:  # an integer past float's range
            return None
        return ParsedAnswer(value, False) if math.isfinite(value) else None
    if not isinstance(answer, str):
        return None
    answer = answer.strip()[:ANSWER_CHARS]
    first_year = None
    for m in _NUMBER.finditer(answer):
        text = m.group("digits")
        value = float(text.replace(",", "") + (f"e{m.group('exponent')}" if m.group("exponent") else ""))
        if not math.isfinite(value):
            continue
        unit = (m.group("unit") or "").lower()
        signs = (m.group("sign") or "") + (m.group("sign2") or "")
        closing = _CLOSING.match(answer, m.end()) is not None
        if any(s in signs for s in "-\u2212\u2013") or ("(" in signs and closing):
            value = -value
        value *= _SCALE.get(unit, 1.0)
        if not math.isfinite(value):       # "1e308 billion": no number an answer could mean
            continue
        plain = not (unit or m.group("currency") or m.group("exponent") or "," in text or "." in text)
        parsed = ParsedAnswer(value, unit.startswith(("%", "per", "pp")))
        if not (plain and 1900 <= abs(value) <= 2100):
            return parsed
        first_year = first_year or parsed
    return first_year


def is_correct(parsed: ParsedAnswer | None, gold: float, unit: str) -> bool:
    """Right when the relative error is at most 1% and the absolute error at most 1.0. A percentage may also be
    given as a fraction (0.125 for 12.5%); a ratio may be given as a percentage (45% for 0.45)."""
    if parsed is None:
        return False
    candidates = [parsed.value]
    if unit == "percent" and not parsed.percent:
        candidates.append(parsed.value * 100)
    if unit == "ratio" and parsed.percent:
        candidates.append(parsed.value / 100)
    return any(abs(c - gold) <= 1.0 and abs(c - gold) <= 0.01 * abs(gold) for c in candidates)


def correctness_reward(answer: Any, gold: float, unit: str) -> float:
    return float(is_correct(parse_answer(answer), gold, unit))


def format_reward(answer: Any) -> float:
    """1 when the answer was submitted as a parseable number (weighted by `format_weight`)."""
    return float(parse_answer(answer) is not None)


# --- read-only SQL ---------------------------------------------------------------------------------------

class QueryRejected(Exception):
    """A query refused before it ran; the message is shown to the model."""


class QueryTimeout(Exception):
    """A query stopped by the time limit."""


OBSERVATION_CHARS = 16_000   # the most text one tool call shows the model (50 rows of a wide table: ~7,000)
ARGUMENTS_CHARS = 40_000     # a tool call's arguments as JSON text: a 20,000-character query, escaped
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


def _cell(value: Any) -> str:
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
    for line in ([" | ".join(_cell(c) for c in columns)] + [" | ".join(_cell(v) for v in row) for row in rows]):
        if size + len(line) > limit:
            shown = max(0, len(lines) - 1)
            lines.append(f"[output truncated at {limit} characters: {shown} of {len(rows)} rows shown; select fewer "
                         "columns, or shorter values]")
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


# --- the environment -------------------------------------------------------------------------------------

def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


def _recorded(arguments: Any) -> Any:
    """A call's arguments as `state()` keeps them: as given, or their JSON cut to ARGUMENTS_CHARS when longer."""
    text = json.dumps(arguments, default=str)
    return arguments if len(text) <= ARGUMENTS_CHARS else text[:ARGUMENTS_CHARS] + "..."


def _counters() -> dict[str, Any]:
    """A fresh episode's `state()`. tables_listed_before_query: list_tables or describe_table came before the first
    run_sql (with no run_sql at all: was called at all); hallucinated_tables: describe_table of a missing table or
    a "no such table" error; hallucinated_columns: "no such column" errors; recoveries: successful run_sql calls
    whose previous run_sql failed (other tools may come between)."""
    return {"task_id": None, "turns": 0, "calls": [], "tables_listed_before_query": False,
            "hallucinated_tables": 0, "hallucinated_columns": 0, "sql_errors": 0, "recoveries": 0,
            "submitted": False, "answer": None, "done": False, "reward": 0.0, "correct": None}


class FinanceSQLEnv:
    """Questions about synthetic companies' statements, answered with list_tables, describe_table, run_sql and
    submit_answer. Splits: train (single-table), eval-single, eval-multi (two tables), each on its own companies.

    Reward on submit_answer: 1 when the number is right (relative error <= 1% and absolute error <= 1.0), plus
    `format_weight` when the answer parses as a number. Running out of turns scores 0."""

    name = "finance-sql"

    def __init__(self, seed: int = 0, companies: int = 1, max_turns: int = 8, row_cap: int = 50,
                 query_timeout: float = 2.0, format_weight: float = 0.1, db_dir: str | None = None):
        problems = []
        if not 1 <= companies <= data.MAX_COMPANIES:
            problems.append(f"companies={companies} must be between 1 and {data.MAX_COMPANIES} (per split)")
        if max_turns < 1:
            problems.append(f"max_turns={max_turns} must be at least 1 (a submit_answer call is a turn)")
        if row_cap < 1:
            problems.append(f"row_cap={row_cap} must be at least 1")
        if not query_timeout > 0:
            problems.append(f"query_timeout={query_timeout} must be a positive number of seconds")
        if not format_weight >= 0:
            problems.append(f"format_weight={format_weight} must be 0 or more")
        if problems:
            raise StropError("finance-sql: " + "; ".join(problems))
        self.seed, self.companies, self.max_turns, self.row_cap = seed, companies, max_turns, row_cap
        self.query_timeout, self.format_weight = float(query_timeout), float(format_weight)
        self._db_dir = Path(db_dir) if db_dir else None
        self._own_dir: Path | None = None  # a temporary folder this env made (removed by close)
        self._created: list[Path] = []     # database files this env wrote (removed by close)
        self._companies: dict[tuple[int, str, int], data.Company] = {}
        self._tasks: dict[str, list[Task]] = {}
        self._db: ReadOnlyDatabase | None = None
        self._task: Task | None = None
        self._state = _counters()
        self._last_sql_failed = False

    # -- tasks ---------------------------------------------------------------------------------------------

    def splits(self) -> list[str]:
        return list(data.SPLITS)

    def tools(self) -> list[dict[str, Any]]:
        return [
            _tool("list_tables", "List the tables of the company's database and what each holds.", {}, []),
            _tool("describe_table", "Show a table's columns (name, type, meaning and units) and a few sample rows.",
                  {"table": {"type": "string", "description": "a table name, as given by list_tables"}}, ["table"]),
            _tool("run_sql", f"Run one read-only SQLite SELECT query (WITH ... SELECT is allowed) and get its rows "
                  f"(at most {self.row_cap}).",
                  {"query": {"type": "string", "description": "a single SELECT statement"}}, ["query"]),
            _tool("submit_answer", "Submit the final answer as a number, e.g. 1234.5 or 12.5%. This ends the "
                  "episode.", {"answer": {"type": ["string", "number"], "description": "the number asked for"}},
                  ["answer"]),
        ]

    def _company(self, seed: int, split: str, index: int) -> data.Company:
        key = (seed, split, index)
        if key not in self._companies:
            self._companies[key] = data.make_company(seed, split, index)
        return self._companies[key]

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        if split not in data.SPLITS:
            raise StropError(f"finance-sql has no split {split!r}; the splits are: {', '.join(data.SPLITS)}")
        if split not in self._tasks:
            tasks = []
            for index in range(self.companies):
                company = self._company(self.seed, split, index)
                for number, q in enumerate(data.make_questions(company, split)):
                    gold = f"{q.gold:.4f}".rstrip("0").rstrip(".")
                    tasks.append(Task(
                        id=f"finance-sql/s{self.seed}/{split}/c{index}/q{number:03d}", prompt=q.text,
                        answer="0" if gold in ("-0", "") else gold, split=split,
                        meta={"kind": q.kind, "formula": q.formula, "measure": q.measure, "unit": q.unit,
                              "tables": q.tables, "single_table": len(q.tables) == 1, "terms": list(q.terms),
                              "company": company.name, "company_index": index, "seed": self.seed}))
            random.Random(f"finance-tasks:{self.seed}:{split}").shuffle(tasks)
            self._tasks[split] = tasks
        return list(self._tasks[split][:limit] if limit is not None else self._tasks[split])

    # -- databases ------------------------------------------------------------------------------------------

    def _database_path(self, seed: int, split: str, index: int) -> Path:
        folder = self._db_dir
        if folder is None:
            if self._own_dir is None or not self._own_dir.exists():
                self._own_dir = Path(tempfile.mkdtemp(prefix="strop-finance-sql-"))
                # removed by close(), or when the env is garbage-collected or the interpreter exits without it
                weakref.finalize(self, shutil.rmtree, str(self._own_dir), True)
            folder = self._own_dir
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"finance-v{data.GENERATOR_VERSION}-s{seed}-{split}-c{index}.sqlite"
        if not path.exists():
            partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
            try:
                data.write_database(self._company(seed, split, index), str(partial))
                partial.chmod(0o444)
                os.replace(partial, path)  # atomic: a reader never sees half a database
            finally:
                partial.unlink(missing_ok=True)
            self._created.append(path)
        return path

    def database_path(self, task: Task) -> Path:
        """The SQLite file of `task`'s company (written if missing)."""
        meta = task.meta or {}
        if task.split not in data.SPLITS or not isinstance(meta.get("company_index"), int):
            raise StropError(f"finance-sql cannot run task {task.id!r}: it needs split in {list(data.SPLITS)} and "
                             "meta.company_index; use a task from FinanceSQLEnv.tasks()")
        return self._database_path(int(meta.get("seed", self.seed)), task.split, meta["company_index"])

    # -- episodes -------------------------------------------------------------------------------------------

    def reset(self, task: Task) -> Observation:
        path = self.database_path(task)
        if self._db is None or self._db.path != path or not path.exists():
            if self._db is not None:
                self._db.close()
            self._db = ReadOnlyDatabase(path, self.query_timeout)
        self._task, self._state, self._last_sql_failed = task, _counters(), False
        self._state["task_id"] = task.id
        company = task.meta.get("company", "the company")
        content = (f"{task.prompt}\n\nThe database holds {company}'s financial statements (money amounts in USD "
                   "millions). Use the tools: list_tables to see the tables, describe_table to see a table's "
                   "columns, run_sql to run one read-only SQL SELECT query, and submit_answer to give your final "
                   f"answer as a number. You have at most {self.max_turns} tool calls.")
        return Observation(content, {"task_id": task.id, "max_turns": self.max_turns,
                                     "tools": [t["function"]["name"] for t in self.tools()]})

    def state(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._state, default=str))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        for path in self._created:
            path.unlink(missing_ok=True)
        self._created.clear()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def step(self, call: ToolCall) -> StepResult:
        st = self._state
        if self._task is None or self._db is None:
            return StepResult(Observation("No episode is running: call reset(task) first."), done=True)
        if st["done"]:
            # reward 0: the episode's reward was given by the step that ended it
            return StepResult(Observation("The episode is over; no more tool calls are taken."), 0.0, True,
                              {"correct": st["correct"]})
        st["turns"] += 1
        arguments, problem = self._check(call)
        if problem is None and call.name == "submit_answer":
            return self._submit(call, arguments)
        if problem is not None:
            content, ok, metadata = problem, False, {"error": "bad_call"}
        else:
            try:
                content, ok, metadata = getattr(self, f"_tool_{call.name}")(**arguments)
            except Exception as error:  # noqa: BLE001 - a step never raises; the model sees what went wrong
                content, ok, metadata = f"Error: {call.name} failed: {error}", False, {"error": type(error).__name__}
        given = arguments if arguments is not None else call.arguments
        st["calls"].append({"name": str(call.name)[:200], "arguments": _recorded(given), "ok": ok})
        if st["turns"] >= self.max_turns:
            content += (f"\n\nThe turn limit ({self.max_turns} tool calls) is reached without an answer; the "
                        "episode is over.")
            st["done"], st["reward"], st["correct"] = True, 0.0, False
            return StepResult(Observation(content, metadata), 0.0, True,
                              {"correct": False, "gold": self._gold(), "parsed": None, "reason": "turn_limit"})
        return StepResult(Observation(content, metadata))

    def _check(self, call: ToolCall) -> tuple[dict | None, str | None]:
        """The call's arguments as a dict, or a message saying what is wrong with the call."""
        listing = "list_tables(), describe_table(table), run_sql(query), submit_answer(answer)"
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in self.tools()}
        if call.name not in schemas:
            return None, f"Error: there is no tool {_cell(call.name)!r}. The tools are: {listing}."
        arguments = call.arguments
        if isinstance(arguments, str):
            if len(arguments) > ARGUMENTS_CHARS:
                return None, (f"Error: the arguments of {call.name} are {len(arguments)} characters long; the limit "
                              f"is {ARGUMENTS_CHARS}.")
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python's stack
                return None, f"Error: the arguments of {call.name} are not valid JSON: {arguments[:200]!r}."
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return None, f"Error: the arguments of {call.name} must be a JSON object, not {type(arguments).__name__}."
        schema = schemas[call.name]
        usage = f"{call.name}({', '.join(schema['properties'])})"
        unknown = sorted(set(arguments) - set(schema["properties"]))
        missing = [k for k in schema["required"] if k not in arguments]
        if unknown or missing:
            what = "; ".join(filter(None, [f"unknown argument(s) {', '.join(unknown)}" if unknown else "",
                                           f"missing argument(s) {', '.join(missing)}" if missing else ""]))
            return None, f"Error: {what}. Call it as {usage}."
        for key, value in arguments.items():
            kinds = schema["properties"][key]["type"]
            kinds = kinds if isinstance(kinds, list) else [kinds]
            fits = (isinstance(value, str) and "string" in kinds) or (
                isinstance(value, (int, float)) and not isinstance(value, bool) and "number" in kinds)
            if not fits:
                return None, (f"Error: argument {key!r} of {call.name} must be a {' or '.join(kinds)}. "
                              f"Call it as {usage}.")
        return arguments, None

    def _gold(self) -> float:
        return float(self._task.answer)

    def _submit(self, call: ToolCall, arguments: dict) -> StepResult:
        st, task, answer = self._state, self._task, arguments["answer"]
        parsed = parse_answer(answer)
        correct = is_correct(parsed, self._gold(), task.meta.get("unit", "usd_millions"))
        terms = {"correctness": float(correct), "format": self.format_weight * float(parsed is not None)}
        reward = sum(terms.values())
        st["calls"].append({"name": call.name, "arguments": _recorded(arguments), "ok": parsed is not None})
        st.update(submitted=True, answer=str(answer)[:ANSWER_CHARS], done=True, reward=reward, correct=correct)
        content = "Answer submitted." if parsed is not None else (
            "Answer submitted, but it contains no number, so it cannot be scored.")
        return StepResult(Observation(content), reward, True,
                          {"correct": correct, "gold": self._gold(), "parsed": parsed.value if parsed else None,
                           "terms": terms})

    def _note_discovery(self) -> None:
        if not any(c["name"] == "run_sql" for c in self._state["calls"]):
            self._state["tables_listed_before_query"] = True

    # -- tools ----------------------------------------------------------------------------------------------

    def _tool_list_tables(self) -> tuple[str, bool, dict]:
        self._note_discovery()
        counts = {t: len(rows) for t, rows in self._company_of_task().tables.items()}
        lines = [f"Tables (money amounts are in USD millions; fiscal years {data.YEARS[0]}-{data.YEARS[-1]}):"]
        for table, (description, _) in data.SCHEMA.items():
            count = counts.get(table, 1)
            lines.append(f"- {table}: {description} ({count} row{'s' if count != 1 else ''})")
        return "\n".join(lines), True, {"tables": list(data.SCHEMA)}

    def _tool_describe_table(self, table: str) -> tuple[str, bool, dict]:
        self._note_discovery()
        name = next((t for t in data.SCHEMA if t.lower() == table.strip().lower()), None)
        if name is None:
            self._state["hallucinated_tables"] += 1
            return (f"Error: there is no table {_cell(table)!r}. The tables are: {', '.join(data.SCHEMA)}.", False,
                    {"error": "no_such_table"})
        description, columns = data.SCHEMA[name]
        sample = self._db.query(f"SELECT * FROM {name} LIMIT 3", 3)
        lines = [f"Table {name}: {description}.", "Columns:"]
        lines += [f"  {column} {kind}: {meaning}" for column, kind, meaning in columns]
        lines += ["Sample rows:", format_rows(sample.columns, sample.rows)]
        return "\n".join(lines), True, {"table": name}

    def _tool_run_sql(self, query: str) -> tuple[str, bool, dict]:
        st = self._state
        try:
            result = self._db.query(query, self.row_cap)
        except Exception as error:  # noqa: BLE001 - every failure is an observation the model can act on
            st["sql_errors"] += 1
            self._last_sql_failed = True
            return self._sql_error(query, error), False, {"error": type(error).__name__}
        if self._last_sql_failed:
            st["recoveries"] += 1
        self._last_sql_failed = False
        text = format_rows(result.columns, result.rows)
        n = len(result.rows)
        if result.truncated:
            text += (f"\n(only the first {n} rows are shown; the query returned more: add a WHERE clause, an "
                     "aggregate or LIMIT)")
        else:
            text += f"\n({n} row{'s' if n != 1 else ''})"
        return text, True, {"rows": n, "truncated": result.truncated, "columns": result.columns}

    def _sql_error(self, query: str, error: Exception) -> str:
        if isinstance(error, QueryTimeout):
            return (f"Error: the query ran longer than {self.query_timeout:g} s and was stopped. Simplify it: filter "
                    "with WHERE, and avoid unbounded recursive CTEs and cross joins.")
        if isinstance(error, QueryRejected):
            return f"Error: {error}"
        message = str(error)
        if message == "too many columns in result set":
            return "Error: too many columns in the result (at most 64); name the columns you need instead of *."
        if message == "string or blob too big":
            return "Error: a value in the result is over 100,000 bytes; select shorter values."
        if "not authorized" in message:
            return "Error: not authorized: only reading with SELECT is allowed on this database."
        if message.startswith("no such table"):
            self._state["hallucinated_tables"] += 1
            return f"Error: {message}. The tables are: {', '.join(data.SCHEMA)} (describe_table shows the columns)."
        if message.startswith("no such column"):
            self._state["hallucinated_columns"] += 1
            named = [t for t in data.SCHEMA if re.search(rf"\b{t}\b", query, re.IGNORECASE)] or list(data.SCHEMA)
            listing = "\n".join(f"Columns of {t}: {', '.join(c for c, _, _ in data.SCHEMA[t][1])}" for t in named)
            return f"Error: {message}.\n{listing}"
        return f"Error: {message}."

    def _company_of_task(self) -> data.Company:
        meta = self._task.meta
        return self._company(int(meta.get("seed", self.seed)), self._task.split, meta["company_index"])
