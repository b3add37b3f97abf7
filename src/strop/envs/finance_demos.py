"""Demonstrations for finance-sql: transcripts of a scripted agent that works the way a good one would, for a
supervised warm start before GRPO (a model that never writes a valid tool call gives GRPO no signal).

    for demo in demonstrations(FinanceSQLEnv(seed=0), n=200, mistakes=0.25, seed=0):
        demo["messages"]   # OpenAI chat format: user, then assistant turns with tool_calls, tool results, ...

The agent lists the tables, describes each table the question needs, queries the rows it needs with one SELECT
per table, computes the answer from what the queries returned and submits it. In a `mistakes` share of
episodes it first makes the mistake a model makes (a column or table name that does not exist), reads the error
and recovers with the right query, so recovering is something a model can learn. Every episode is played
against the environment itself: its tool results are the environment's, and a demonstration is kept only when
the environment scored the answer correct.

Only the train split is demonstrated; the evaluation splits' companies stay unseen.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from contextlib import closing

from strop.envs import finance_data as data
from strop.envs.base import Task, ToolCall
from strop.errors import StropError

DEMO_SPLITS = ("train",)
# (wrong name, right name) pairs a model plausibly writes; a wrong table is from the same pool of mistakes
COLUMN_MISTAKES = {"revenue": "revenues", "net_income": "net_profit", "gross_profit": "gross_margin",
                   "operating_income": "operating_profit", "total_assets": "assets",
                   "shareholders_equity": "equity", "free_cash_flow": "fcf", "capital_expenditure": "capex",
                   "operating_cash_flow": "cash_from_operations", "cost_of_revenue": "cogs",
                   "long_term_debt": "debt", "income_tax": "tax", "pretax_income": "income_before_tax"}
TABLE_MISTAKES = {"income_statement": "income", "balance_sheet": "balance", "cash_flow": "cash_flows",
                  "segment_revenue": "segments"}


def demonstrations(env, *, split: str = "train", n: int | None = None, mistakes: float = 0.25, seed: int = 0):
    """Up to `n` demonstrations (all of the split's tasks when None), each a dict with `messages`, `tools`,
    `task`, `reward`, `mistake` and the environment's final `state`. Yields them one by one."""
    if split not in DEMO_SPLITS:
        raise StropError(f"demonstrations come from the train split only, not {split!r}: the evaluation splits' "
                         "companies must stay unseen by training")
    if not 0.0 <= mistakes <= 1.0:
        raise StropError(f"mistakes must be a share from 0 to 1, got {mistakes}")
    rng = random.Random(f"finance-demos:{seed}")
    made = 0
    for task in env.tasks(split):
        if n is not None and made >= n:
            return
        demo = play_demonstration(env, task, mistake=rng.random() < mistakes, rng=rng)
        if demo["state"].get("correct"):
            made += 1
            yield demo


def play_demonstration(env, task: Task, *, mistake: bool, rng: random.Random) -> dict:
    """One scripted episode of `task` against `env`, as an OpenAI-format transcript."""
    first = env.reset(task)
    messages = [{"role": "user", "content": first.content}]
    calls = 0

    def call(name: str, arguments: dict) -> str:
        nonlocal calls
        call_id = f"call_{calls}"
        calls += 1
        result = env.step(ToolCall(name, arguments, call_id))
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result.observation.content})
        return result.observation.content

    terms = task.meta["terms"]
    tables = sorted({t["table"] for t in terms})
    call("list_tables", {})
    for table in tables:
        call("describe_table", {"table": table})
    queries = {table: _query(table, [t for t in terms if t["table"] == table]) for table in tables}
    if mistake:
        table = rng.choice(tables)
        call("run_sql", {"query": _mistaken(queries[table], table, rng)})
    values = {}
    with closing(sqlite3.connect(f"file:{env.database_path(task)}?mode=ro", uri=True)) as db:
        for table, sql in queries.items():
            call("run_sql", {"query": sql})
            only = {t["column"] for t in terms if t["table"] == table}
            for row in db.execute(sql):
                values[_key(table, row, only)] = row[-1]
    answer = _answer(task.meta["formula"], [values[_term_key(t)] for t in terms], task.meta["unit"])
    call("submit_answer", {"answer": answer})
    return {"messages": messages, "tools": env.tools(), "task": task.id, "mistake": mistake,
            "reward": float(env.state().get("reward", 0.0)), "state": env.state()}


def _query(table: str, terms: list[dict]) -> str:
    """One SELECT returning (fiscal_year[, segment], column) rows for every term of `table`."""
    columns = sorted({t["column"] for t in terms})
    years = ", ".join(str(y) for y in sorted({t["year"] for t in terms}))
    if table == "segment_revenue":
        segments = ", ".join("'" + s.replace("'", "''") + "'" for s in sorted({t["segment"] for t in terms}))
        return (f"SELECT fiscal_year, segment, revenue FROM segment_revenue WHERE fiscal_year IN ({years}) "
                f"AND segment IN ({segments}) ORDER BY fiscal_year")
    if len(columns) == 1:
        return f"SELECT fiscal_year, {columns[0]} FROM {table} WHERE fiscal_year IN ({years}) ORDER BY fiscal_year"
    # several columns of one table: one row per (year, column), so each value is read as (year, column, value)
    parts = [f"SELECT fiscal_year, '{c}' AS item, {c} AS value FROM {table} WHERE fiscal_year IN ({years})"
             for c in columns]
    return " UNION ALL ".join(parts) + " ORDER BY fiscal_year"


def _key(table: str, row: tuple, columns: set[str]) -> tuple:
    """The (table, column, year, segment) a result row of `_query` holds."""
    if table == "segment_revenue":
        return table, "revenue", row[0], row[1]
    if len(row) == 3:
        return table, row[1], row[0], None
    return table, next(iter(columns)), row[0], None


def _term_key(term: dict) -> tuple:
    if term["table"] == "segment_revenue":
        return term["table"], "revenue", term["year"], term["segment"]
    return term["table"], term["column"], term["year"], None


def _mistaken(sql: str, table: str, rng: random.Random) -> str:
    """The query with a name a model might invent: a wrong column where one has a likely mistake, else a wrong
    table."""
    wrong_columns = [c for c in COLUMN_MISTAKES if re.search(rf"\b{c}\b", sql)]
    if wrong_columns and rng.random() < 0.7:
        column = rng.choice(wrong_columns)
        return re.sub(rf"\b{column}\b", COLUMN_MISTAKES[column], sql)
    return sql.replace(f"FROM {table}", f"FROM {TABLE_MISTAKES[table]}")


def _answer(formula: str, values: list[float], unit: str) -> str:
    growth = lambda a, b: (b - a) / a * 100  # noqa: E731
    if formula == "value":
        result = values[0]
    elif formula == "difference":
        result = values[1] - values[0]
    elif formula == "growth":
        result = growth(values[0], values[1])
    elif formula == "average":
        result = sum(values) / len(values)
    elif formula in ("percent", "ratio"):
        result = values[0] / values[1] * (100 if formula == "percent" else 1)
    elif formula == "growth_gap":
        result = growth(values[0], values[1]) - growth(values[2], values[3])
    else:
        raise StropError(f"no scripted answer for formula {formula!r}")
    if unit == "percent":
        return f"{result:.2f}%"
    if unit == "ratio":
        return f"{result:.3f}"
    return f"{result:.2f}"


__all__ = ["demonstrations", "play_demonstration", "DEMO_SPLITS", "data"]
