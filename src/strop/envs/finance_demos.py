"""Demonstrations for finance-sql: transcripts of a scripted agent that works the way a good one would, for a
supervised warm start before GRPO (a model that never writes a valid tool call gives GRPO no signal).

    for demo in demonstrations(FinanceSQLEnv(seed=0), n=200, mistakes=0.25, seed=0):
        demo["messages"]   # OpenAI chat format: user, then assistant turns with tool_calls, tool results, ...

The agent lists the tables, describes each table the question needs, then lets the database do the arithmetic:
one SELECT computes the answer (each stored value it needs as a scalar subquery, combined by the question's
formula and rounded to the precision asked for), and the agent submits the number the query returned. A small
model cannot divide 172.2 by 145.4 in its head, but it can learn to write the query and copy its result; and the
same pattern, a subquery per value, answers a question whose values sit in two tables. In a `mistakes` share of
episodes the agent first makes the mistake a model makes (a column or table name that does not exist), reads
the error and recovers with the right query, so recovering is something a model can learn. The mistaken turn
itself carries OpenAI's `"weight": 0`, so a warm start reads it (and the error it caused) as context but never
learns to write it: what is trained is the recovery. Every episode is
played against the environment itself: its tool results are the environment's, and a demonstration is kept
only when the environment scored the answer correct.

Only the train split is demonstrated; the evaluation splits' companies stay unseen.
"""

from __future__ import annotations

import json
import random
import re

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

    def call(name: str, arguments: dict, trained: bool = True) -> str:
        nonlocal calls
        call_id = f"call_{calls}"
        calls += 1
        result = env.step(ToolCall(name, arguments, call_id))
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
        # a deliberate mistake is shown, not taught: supervised training on it at full weight taught the model
        # to invent `revenues` and `income` as often as it taught it to recover from them
        messages.append(turn if trained else {**turn, "weight": 0})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result.observation.content})
        return result.observation.content

    terms = task.meta["terms"]
    tables = sorted({t["table"] for t in terms})
    call("list_tables", {})
    for table in tables:
        call("describe_table", {"table": table})
    sql = answer_query(task.meta["formula"], terms, task.meta["unit"])
    if mistake:
        call("run_sql", {"query": _mistaken(sql, rng.choice(tables), rng)}, trained=False)
    shown = call("run_sql", {"query": sql})
    call("submit_answer", {"answer": _copied(shown, task.meta["unit"])})
    return {"messages": messages, "tools": env.tools(), "task": task.id, "mistake": mistake,
            "reward": float(env.state().get("reward", 0.0)), "state": env.state()}


def _value_sql(term: dict) -> str:
    """A scalar subquery for one stored value."""
    where = f"fiscal_year = {term['year']}"
    if "segment" in term:
        where += " AND segment = '" + term["segment"].replace("'", "''") + "'"
    return f"(SELECT {term['column']} FROM {term['table']} WHERE {where})"


def answer_query(formula: str, terms: list[dict], unit: str) -> str:
    """One SELECT whose single value is the answer, rounded as the question asks (2 places; 3 for a ratio)."""
    first = terms[0]
    if formula == "value":
        return _value_sql(first)[1:-1]
    if formula == "average":
        years = sorted(t["year"] for t in terms)
        where = f"fiscal_year BETWEEN {years[0]} AND {years[-1]}"
        if "segment" in first:
            where += " AND segment = '" + first["segment"].replace("'", "''") + "'"
        return f"SELECT ROUND(AVG({first['column']}), 2) AS average FROM {first['table']} WHERE {where}"
    v = [_value_sql(t) for t in terms]
    growth = lambda a, b: f"100.0 * ({b} - {a}) / {a}"  # noqa: E731
    expression, name = {
        "difference": (lambda: f"{v[1]} - {v[0]}", "change"),
        "growth": (lambda: growth(v[0], v[1]), "growth_percent"),
        "percent": (lambda: f"100.0 * {v[0]} / {v[1]}", "percent"),
        "ratio": (lambda: f"1.0 * {v[0]} / {v[1]}", "ratio"),
        "growth_gap": (lambda: f"{growth(v[0], v[1])} - {growth(v[2], v[3])}", "gap_points"),
    }.get(formula, (None, None))
    if expression is None:
        raise StropError(f"no scripted query for formula {formula!r}")
    return f"SELECT ROUND({expression()}, {3 if unit == 'ratio' else 2}) AS {name}"


def _copied(shown: str, unit: str) -> str:
    """The answer as a model would copy it from the query's result: the value under the header, with a % for a
    percentage."""
    value = shown.splitlines()[1].strip()
    return value + "%" if unit == "percent" else value


def _mistaken(sql: str, table: str, rng: random.Random) -> str:
    """The query with a name a model might invent: a wrong column where one has a likely mistake, else a wrong
    table."""
    wrong_columns = [c for c in COLUMN_MISTAKES if re.search(rf"\b{c}\b", sql)]
    if wrong_columns and rng.random() < 0.7:
        column = rng.choice(wrong_columns)
        return re.sub(rf"\b{column}\b", COLUMN_MISTAKES[column], sql, count=1)
    return sql.replace(f"FROM {table}", f"FROM {TABLE_MISTAKES[table]}", 1)



__all__ = ["demonstrations", "play_demonstration", "answer_query", "DEMO_SPLITS"]
