"""Hostile input against the parts of strop that read text they did not write: the finance-sql answer parser and
SQL checks, the observations an environment hands a model, `strop serve` and `strop envs serve`. Each attack
costs bounded time and memory, and gets an error a person can act on."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from strop.envs.base import ToolCall
from strop.envs.finance_sql import FinanceSQLEnv, parse_answer, single_select

# ---- parsers of model text: adversarial strings under a time budget ----------------------------------------

ADVERSARIAL = {
    "spaces then x": " " * 400 + "x",                      # was ~51 s: adjacent \s* around optional groups
    "many spaces then x": " " * 20_000 + "x",
    "spaces between signs": "- " * 5_000 + "$" + " " * 5_000 + "x",
    "comma runs": "1," * 400_000,                           # was seconds: a copy of the rest per number
    "digit run": "9" * 200_000,
    "grouped digits never closed": "1" + ",000" * 50_000 + ",00",
    "years only": "2020 " * 100_000,
    "parens": "(" * 100_000 + "1",
    "units": "1 percentage " * 50_000,
    "exponents": "1e" * 100_000,
}


def _timed(fn, argument, results) -> None:
    started = time.perf_counter()
    try:
        fn(argument)
    except Exception:  # noqa: BLE001 - refused or not, only the time matters here
        pass
    results.put(time.perf_counter() - started)


def seconds_taken(fn, argument, give_up: float = 10.0) -> float:
    """How long fn(argument) ran, measured in a forked child that is killed after `give_up` seconds (so a
    regression to super-linear matching fails here instead of hanging the suite)."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_timed, args=(fn, argument, results))
    child.start()
    child.join(give_up)
    if child.is_alive():
        child.kill()
        child.join()
        return float("inf")
    return results.get(timeout=5)


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_the_answer_parser_takes_bounded_time(name):
    assert seconds_taken(parse_answer, ADVERSARIAL[name]) < 0.25


def test_answers_are_read_from_their_first_characters_only():
    assert parse_answer(" " * 50_000 + "12.5%").value == 12.5               # stripped before the cap
    assert parse_answer("x" * 5_000 + " 12.5") is None                       # past the cap: not read
    assert parse_answer(10 ** 400) is None and parse_answer("1e999") is None  # no infinite answers


@pytest.mark.parametrize("sql", ["SELECT " + "'" * 19_990, "SELECT " + "/*" * 9_990, "SELECT 1" + ";" * 19_990,
                                 "SELECT " + "-- \n" * 4_990, "SELECT " + "[" * 19_990, " " * 19_999 + "S"])
def test_the_sql_statement_check_takes_bounded_time(sql):
    assert seconds_taken(single_select, sql) < 0.25


@pytest.fixture
def finance(tmp_path):
    env = FinanceSQLEnv(seed=0, db_dir=str(tmp_path))
    env.reset(env.tasks("train", 1)[0])
    yield env
    env.close()


def test_a_hostile_answer_is_scored_at_once(finance):
    assert seconds_taken(finance.step, ToolCall("submit_answer", {"answer": " " * 400 + "x"})) < 0.5
    result = finance.step(ToolCall("submit_answer", {"answer": " " * 400 + "x"}))
    assert result.done and result.reward == 0.0 and "contains no number" in result.observation.content


@pytest.mark.parametrize("query", [
    "SELECT " + ", ".join(["*"] * 55) + " FROM income_statement a, income_statement b, balance_sheet c",  # 1,925
                                                                            # columns x 50 rows
    "SELECT " + ", ".join(["randomblob(900000)"] * 60),                     # was 54 MB of cells in one row
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 50) "
    "SELECT n, printf('%.*c', 99999, 'x') FROM r",
])
def test_an_observation_is_bounded_whatever_the_query(finance, query):
    started = time.perf_counter()
    content = finance.step(ToolCall("run_sql", {"query": query})).observation.content
    assert time.perf_counter() - started < 3.0
    assert len(content) <= 16_000 + 300
    assert "truncated" in content or "only the first" in content or content.startswith("Error:"), content[:300]


def test_tool_arguments_a_model_wrote_badly_are_observations(finance):
    for arguments, says in (("[" * 30_000, "not valid JSON"), ("{" + '"a": 1, ' * 200_000 + "}", "the limit is")):
        content = finance.step(ToolCall("run_sql", arguments)).observation.content
        assert content.startswith("Error:") and says in content and len(content) < 1_000
    content = finance.step(ToolCall("describe_table", {"table": "x" * 1_000_000})).observation.content
    assert content.startswith("Error: there is no table") and len(content) < 1_000
    assert len(json.dumps(finance.state())) < 200_000     # what rollouts keep of those calls (was 1.9 MB)
