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
import os
import random
import re
import shutil
import tempfile
import uuid
import weakref
from pathlib import Path
from typing import Any

from strop.envs import finance_data as data
from strop.envs.base import Observation, StepResult, Task, ToolCall
from strop.envs.finance_answers import ANSWER_CHARS, correctness_reward, format_reward, is_correct, parse_answer
from strop.envs.readonly_sql import (QueryRejected, QueryTimeout, ReadOnlyDatabase, cell_text,
                                     format_rows, single_select)
from strop.errors import StropError

__all__ = ["FinanceSQLEnv", "ReadOnlyDatabase", "correctness_reward", "format_reward", "is_correct", "parse_answer",
           "single_select"]  # the answer and SQL names also kept here, where callers have always found them

ARGUMENTS_CHARS = 40_000     # a tool call's arguments as JSON text: a 20,000-character query, escaped


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

    def reference_calls(self, task: Task) -> list[ToolCall]:
        """The calls a good agent makes for `task`, in order: the scripted agent's (`strop.envs.finance_demos`):
        list_tables, describe_table for each table the question needs, one query that computes the answer, and
        the answer. A GRPO run with `scout` "reference" branches its groups from them (`strop.rl.branching`)."""
        from strop.envs.finance_demos import answer_query  # lazy: the demonstrations import this module's kin
        terms = task.meta["terms"]
        tables = sorted({t["table"] for t in terms})
        answer = task.answer + ("%" if task.meta["unit"] == "percent" else "")
        calls = [("list_tables", {}), *(("describe_table", {"table": t}) for t in tables),
                 ("run_sql", {"query": answer_query(task.meta["formula"], terms, task.meta["unit"])}),
                 ("submit_answer", {"answer": answer})]
        return [ToolCall(name, arguments, f"call_{i}") for i, (name, arguments) in enumerate(calls)]

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
            return None, f"Error: there is no tool {cell_text(call.name)!r}. The tools are: {listing}."
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
            return (f"Error: there is no table {cell_text(table)!r}. The tables are: {', '.join(data.SCHEMA)}.", False,
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
