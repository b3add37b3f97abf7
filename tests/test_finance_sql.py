"""finance-sql: gold numbers agree with the data, splits are disjoint, hostile SQL changes nothing, and the
rubric counters describe what the model did.

The scripted agent below answers from the task's meta with SQL it composes itself, so a gold number that does not
follow from the stored rows fails here.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time

import pytest

from strop.envs import Environment, ToolCall, get_env
from strop.envs import finance_data as data
from strop.envs.finance_answers import is_correct, parse_answer
from strop.envs.finance_sql import FinanceSQLEnv
from strop.envs.readonly_sql import ReadOnlyDatabase, single_select
from strop.errors import StropError

FORMAT = 0.1


@pytest.fixture
def env(tmp_path):
    env = FinanceSQLEnv(seed=0, query_timeout=0.5, db_dir=str(tmp_path / "dbs"))
    yield env
    env.close()


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- a scripted agent ------------------------------------------------------------------------------------

def term_sql(term: dict) -> str:
    where = f"fiscal_year = {term['year']}" + (f" AND segment = '{term['segment']}'" if "segment" in term else "")
    return f"(SELECT {term['column']} FROM {term['table']} WHERE {where})"


def compose_sql(meta: dict) -> str:
    """One query computing the answer: a JOIN for same-year two-table ratios, scalar subqueries otherwise."""
    terms, formula = meta["terms"], meta["formula"]
    scale = "100.0" if formula == "percent" else "1.0"
    if formula in ("percent", "ratio") and len(meta["tables"]) == 2:
        a, b = terms
        segment = f" AND a.segment = '{a['segment']}'" if "segment" in a else ""
        return (f"SELECT a.{a['column']} * {scale} / b.{b['column']} FROM {a['table']} AS a JOIN {b['table']} AS b "
                f"ON a.fiscal_year = b.fiscal_year WHERE a.fiscal_year = {a['year']}{segment}")
    t = [term_sql(term) for term in terms]
    expression = {
        "value": lambda: t[0],
        "difference": lambda: f"{t[1]} - {t[0]}",
        "growth": lambda: f"({t[1]} - {t[0]}) * 100.0 / {t[0]}",
        "average": lambda: f"({' + '.join(t)}) / {len(t)}.0",
        "percent": lambda: f"{t[0]} * 100.0 / {t[1]}",
        "ratio": lambda: f"{t[0]} * 1.0 / {t[1]}",
        "growth_gap": lambda: f"(({t[1]} - {t[0]}) * 100.0 / {t[0]}) - (({t[3]} - {t[2]}) * 100.0 / {t[2]})",
    }[formula]()
    return f"SELECT {expression} AS answer"


def written(value: float, unit: str, style: int) -> str:
    """The answer as a person might write it; the styles exercise the parser."""
    if unit == "percent":
        return [f"{value:.2f}%", f"{value:.2f}", f"{value / 100:.5f}"][style % 3]
    if unit == "ratio":
        return f"{value:.3f}"
    return [f"{value:.1f}", f"${value:,.1f}", f"{value:,.1f} million", f"USD {value:.1f}m"][style % 4]


def solve(env, task, style: int = 0):
    env.reset(task)
    env.step(ToolCall("list_tables", {}))
    for table in task.meta["tables"]:
        assert env.step(ToolCall("describe_table", {"table": table})).observation.metadata["table"] == table
    result = env.step(ToolCall("run_sql", {"query": compose_sql(task.meta)}))
    assert result.observation.metadata.get("rows") == 1, result.observation.content
    value = float(result.observation.content.splitlines()[1])
    return env.step(ToolCall("submit_answer", {"answer": written(value, task.meta["unit"], style)}))


@pytest.mark.parametrize("split", ["train", "eval-single", "eval-multi"])
def test_scripted_agent_answers_every_task_correctly(env, split):
    tasks = env.tasks(split)
    assert len(tasks) >= 50
    for style, task in enumerate(tasks):
        final = solve(env, task, style)
        assert final.done and final.info["correct"], (task.prompt, task.answer, final.info)
        assert final.reward == pytest.approx(1 + FORMAT)
        state = env.state()
        assert state["correct"] is True and state["tables_listed_before_query"] is True
        assert state["sql_errors"] == state["hallucinated_tables"] == state["hallucinated_columns"] == 0


def test_other_seeds_and_companies_are_consistent_too(tmp_path):
    env = FinanceSQLEnv(seed=7, companies=3, db_dir=str(tmp_path))
    try:
        for split in env.splits():
            tasks = env.tasks(split)
            assert {t.meta["company_index"] for t in tasks} == {0, 1, 2}
            for task in tasks[::7]:
                assert solve(env, task).info["correct"], task.prompt
    finally:
        env.close()


def test_accounting_identities_hold_in_the_database(env):
    for split in env.splits():
        db = sqlite3.connect(env.database_path(env.tasks(split, 1)[0]))
        checks = {
            "SELECT max(abs(gross_profit - (revenue - cost_of_revenue))) FROM income_statement": 0,
            "SELECT max(abs(operating_income - (gross_profit - operating_expenses))) FROM income_statement": 0,
            "SELECT max(abs(net_income - (pretax_income - income_tax))) FROM income_statement": 0,
            "SELECT max(abs(shareholders_equity - (total_assets - total_liabilities))) FROM balance_sheet": 0,
            "SELECT max(abs(free_cash_flow - (operating_cash_flow - capital_expenditure))) FROM cash_flow": 0,
            "SELECT max(abs(s.total - i.revenue)) FROM income_statement i JOIN (SELECT fiscal_year, sum(revenue) "
            "AS total FROM segment_revenue GROUP BY fiscal_year) s USING (fiscal_year)": 0,
        }
        for query in checks:
            assert db.execute(query).fetchone()[0] < 1e-6, query
        assert db.execute("SELECT count(*), min(fiscal_year), max(fiscal_year) FROM income_statement").fetchone() == (
            6, 2019, 2024)
        assert db.execute("SELECT min(shareholders_equity), min(revenue) FROM balance_sheet JOIN income_statement "
                          "USING (fiscal_year)").fetchone() > (0, 100)
        db.close()


# --- determinism and splits ------------------------------------------------------------------------------

def summary(env) -> dict:
    return {split: [(t.id, t.prompt, t.answer) for t in env.tasks(split)] for split in env.splits()}


def test_same_seed_same_tasks_and_databases_other_seed_different(tmp_path):
    a, b, c = (FinanceSQLEnv(seed=s, db_dir=str(tmp_path / str(i))) for i, s in enumerate((0, 0, 1)))
    try:
        assert summary(a) == summary(b)
        task = a.tasks("train", 1)[0]
        assert sha256(a.database_path(task)) == sha256(b.database_path(task))
        other = summary(c)
        for split in a.splits():
            assert {p for _, p, _ in summary(a)[split]}.isdisjoint({p for _, p, _ in other[split]})
        assert a.tasks("train", 10) == a.tasks("train")[:10]
    finally:
        for env in (a, b, c):
            env.close()


def test_splits_are_disjoint_and_have_the_right_kinds(env):
    tasks = {split: env.tasks(split) for split in env.splits()}
    assert env.splits() == ["train", "eval-single", "eval-multi"]
    companies = {split: {t.meta["company"] for t in ts} for split, ts in tasks.items()}
    pairs = {split: {(t.meta["company"], t.prompt) for t in ts} for split, ts in tasks.items()}
    for x, y in [("train", "eval-single"), ("train", "eval-multi"), ("eval-single", "eval-multi")]:
        assert companies[x].isdisjoint(companies[y]) and pairs[x].isdisjoint(pairs[y])
        assert {t.id for t in tasks[x]}.isdisjoint({t.id for t in tasks[y]})
    single_kinds = {"value", "difference", "growth", "average", "margin", "ratio"}
    for split in ("train", "eval-single"):
        assert all(t.meta["single_table"] and len(t.meta["tables"]) == 1 for t in tasks[split])
        assert {t.meta["kind"] for t in tasks[split]} == single_kinds
    assert all(not t.meta["single_table"] and len(t.meta["tables"]) >= 2 for t in tasks["eval-multi"])
    assert {"return_on_equity", "segment_share", "fcf_to_net_income", "growth_gap"} <= {
        t.meta["kind"] for t in tasks["eval-multi"]}
    for t in tasks["train"]:
        assert t.meta["company"] in t.prompt and str(t.meta["terms"][0]["year"]) in t.prompt
        assert ("USD millions" in t.prompt) == (t.meta["unit"] == "usd_millions")
        assert ("percentage" in t.prompt) == (t.meta["unit"] == "percent")
    with pytest.raises(StropError, match="eval-multi"):
        env.tasks("test")


def test_the_env_meets_the_protocol_and_is_registered():
    env = get_env("finance-sql", seed=3, companies=2)
    try:
        assert isinstance(env, Environment) and env.name == "finance-sql" and env.max_turns == 8
        names = [t["function"]["name"] for t in env.tools()]
        assert names == ["list_tables", "describe_table", "run_sql", "submit_answer"]
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in env.tools())
    finally:
        env.close()
    with pytest.raises(StropError, match="companies=0"):
        FinanceSQLEnv(companies=0)


# --- SQL safety ------------------------------------------------------------------------------------------

CROSS_JOIN = "SELECT count(*) FROM " + ", ".join(f"income_statement t{i}" for i in range(12))
HOSTILE = [
    "INSERT INTO company VALUES ('x', 'x', 'x', 'x', 'x', 'x')",
    "UPDATE income_statement SET revenue = 0",
    "DELETE FROM cash_flow",
    "DROP TABLE company",
    "CREATE TABLE x (a)",
    "ATTACH DATABASE '/tmp/strop-finance-attack.db' AS x",
    "PRAGMA writable_schema = ON",
    "SELECT 1; DROP TABLE company",
    "select 1 ;\n  drop table company",
    "SELECT ';'; DELETE FROM company",
    "WITH x AS (SELECT 1) DELETE FROM company",
    "WITH x AS (SELECT 1) UPDATE income_statement SET revenue = 0",
    "SELECT load_extension('/tmp/nothing.so')",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    CROSS_JOIN,
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_sql_is_refused_quickly_and_changes_nothing(env, query):
    task = env.tasks("train", 1)[0]
    path = env.database_path(task)
    before = sha256(path)
    env.reset(task)
    started = time.monotonic()
    result = env.step(ToolCall("run_sql", {"query": query}))
    elapsed = time.monotonic() - started
    assert elapsed < env.query_timeout + 1.0
    assert result.observation.content.startswith("Error:") and not result.done
    assert env.state()["sql_errors"] == 1 and env.state()["calls"][-1]["ok"] is False
    after = env.step(ToolCall("run_sql", {"query": "SELECT count(*) FROM income_statement"}))
    assert after.observation.content.splitlines()[:2] == ["count(*)", "6"]
    assert env.state()["recoveries"] == 1
    assert sha256(path) == before


def test_timeouts_say_so(env):
    env.reset(env.tasks("train", 1)[0])
    for query in (HOSTILE[-2], CROSS_JOIN):
        content = env.step(ToolCall("run_sql", {"query": query})).observation.content
        assert "ran longer than 0.5 s" in content


def test_each_safety_layer_holds_on_its_own(env, tmp_path):
    path = env.database_path(env.tasks("train", 1)[0])
    before = sha256(path)
    # the authorizer, even for statements the single-SELECT check would have refused first
    db = ReadOnlyDatabase(path, timeout=0.5)
    for statement in ("DELETE FROM company", "DROP TABLE company", "PRAGMA writable_schema = ON",
                      "ATTACH DATABASE ':memory:' AS x", "CREATE TEMP TABLE t (a)", "BEGIN"):
        with pytest.raises(sqlite3.DatabaseError, match="not authorized|too many attached"):
            db.conn.execute(statement)
    db.close()
    # read-only mode with no authorizer at all
    plain = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        plain.execute("DELETE FROM company")
    plain.close()
    assert sha256(path) == before
    # the statement check
    assert single_select("  -- a comment\n SELECT ';' AS s; /* trailing */ ") == "SELECT ';' AS s"
    assert single_select('SELECT "a;b" FROM [x;y]') == 'SELECT "a;b" FROM [x;y]'
    for bad in ("SELECT 1; SELECT 2", "SELECT 'it''s'; DROP TABLE x", "VALUES (1)", "", "EXPLAIN SELECT 1"):
        with pytest.raises(Exception, match="only"):
            single_select(bad)


PRINTF_BOMBS = ["SELECT printf('%.*c', 2000000000, 'x')", "SELECT format('%.*c', 2000000000, 'x')",
                "SELECT printf('%.2000000000c', 'x')", "SELECT printf('%' || '.1999999999' || 'c', 'x')",
                "SELECT printf('%d %.*c', 1, '2e9', 'x')", "SELECT printf('%.*%%n%.*c', 1, 2000000000, 'x')",
                "SELECT " + " || ".join(["printf('%.*c', 1500000000, 'x')"] * 200)]
# SQLite's trims compare each character of X with each of Y (99,000 x 8,000: 2.5 s a call)
TRIM = "length({}(printf('%.*c', 99000, 'a'), printf('%.*c', 8000, 'b') || 'a'))"
TRIM_BOMBS = ["SELECT " + " + ".join([TRIM.format(name)] * 150) for name in ("trim", "ltrim", "rtrim")]


@pytest.mark.parametrize("query", PRINTF_BOMBS + TRIM_BOMBS)
def test_no_function_call_spins_out_of_the_time_limits_reach(env, query):
    """SQLite's printf repeats %c's character `precision` times in one function call, out of the progress
    handler's reach (2e9: ~11 s here), and its trims take ~2.5 s a call; a query holds hundreds of calls. strop's
    printf answers NULL at once and its trims are linear."""
    env.reset(env.tasks("train", 1)[0])
    started = time.monotonic()
    content = env.step(ToolCall("run_sql", {"query": query})).observation.content
    assert time.monotonic() - started < env.query_timeout + 2.0
    if query in PRINTF_BOMBS:
        assert content.splitlines()[1] == "NULL"
    else:  # linear now: done, or stopped by the time limit between calls (this fixture's limit is 0.5 s)
        assert content.splitlines()[1:2] == ["0"] or "ran longer than" in content


def test_printf_and_trims_give_what_sqlite_gives(env, tmp_path):
    """Every format and trim a query may reasonably use gives what SQLite's own functions give."""
    db = ReadOnlyDatabase(env.database_path(env.tasks("train", 1)[0]), timeout=2.0)
    plain = sqlite3.connect(":memory:")
    calls = ["printf('%.2f%%', 12.3456)", "printf('%5d|%-5s|%,d', 42, 'ab', 1234567)", "format('%s-%s', 'a', 3)",
             "printf('%.*c|%s', 3, 'x', 'y')", "printf('%n%.*c|%s', 3, 'x', 'y')", "printf('%.*%%.*c', 3, 4, 'x')",
             "printf('%lld %ld %e %g %x %o %q %Q %w', 1, 2, 3.5, 0.0001, 255, 8, 'it''s', NULL, 'a\"b')",
             "printf('%-*d|%*.*f', -4, 7, 9, 3, 3.14159)", "printf()", "printf(NULL)", "printf(3)",
             "printf('%s', x'41')",
             "printf('%T%d', 1)", "printf('%!.20g', 0.1)", "length(printf('%050000d', 1))",
             "trim('  x  ')", "ltrim('xxaxx', 'x')", "rtrim('xxaxx', 'x')", "trim(12.5, '1')", "trim(x'2020412020')",
             "trim(NULL)", "trim('a', NULL)", "trim('', 'a')", "trim('aaa', '')",
             "rtrim('é€😀x😀€', '€😀')",
             "trim(' \t x \t ')", "ltrim(120, 1)", "typeof(trim(x'41'))"]
    for call in calls:
        assert db.conn.execute(f"SELECT {call}").fetchone() == plain.execute(f"SELECT {call}").fetchone(), call
    db.close()


def test_row_cap_flags_truncation(tmp_path):
    env = FinanceSQLEnv(seed=0, row_cap=5, db_dir=str(tmp_path))
    try:
        env.reset(env.tasks("train", 1)[0])
        capped = env.step(ToolCall("run_sql", {"query": "SELECT * FROM segment_revenue"})).observation
        assert capped.metadata["truncated"] is True and capped.metadata["rows"] == 5
        assert len(capped.content.splitlines()) == 1 + 5 + 1 and "only the first 5 rows" in capped.content
        fits = env.step(ToolCall("run_sql", {"query": "SELECT fiscal_year FROM income_statement LIMIT 5"}))
        assert fits.observation.metadata["truncated"] is False and fits.observation.content.endswith("(5 rows)")
    finally:
        env.close()


def test_unknown_names_get_the_valid_ones(env):
    env.reset(env.tasks("train", 1)[0])
    column = env.step(ToolCall("run_sql", {"query": "SELECT revenu FROM income_statement"})).observation.content
    assert "no such column: revenu" in column
    assert "Columns of income_statement: fiscal_year, revenue, cost_of_revenue" in column
    assert "Columns of balance_sheet" not in column
    table = env.step(ToolCall("run_sql", {"query": "SELECT * FROM income"})).observation.content
    assert "no such table: income" in table and "income_statement, balance_sheet, cash_flow" in table
    described = env.step(ToolCall("describe_table", {"table": "revenues"})).observation.content
    assert "no table 'revenues'" in described and "segment_revenue" in described
    state = env.state()
    assert (state["hallucinated_columns"], state["hallucinated_tables"], state["sql_errors"]) == (1, 2, 2)


def test_describe_table_shows_units_and_sample_rows(env):
    env.reset(env.tasks("train", 1)[0])
    content = env.step(ToolCall("describe_table", {"table": "cash_flow"})).observation.content
    assert "free_cash_flow REAL: operating_cash_flow - capital_expenditure, USD millions" in content
    assert content.splitlines()[-3].startswith("2019 | ")


# --- answers and rewards ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value, percent", [
    ("12.5", 12.5, False), ("12.5%", 12.5, True), ("12.5 percent", 12.5, True), ("$1,234.5", 1234.5, False),
    ("1,234.5 million", 1234.5, False), ("USD 12m", 12.0, False), ("US$ 1.2 billion", 1200.0, False),
    ("(3.4)", -3.4, False), ("-5.25%", -5.25, True), ("\u22127.5 %", -7.5, True), (" 0.125 ", 0.125, False),
    ("The answer is 12.5% (fiscal 2023 vs 2022)", 12.5, True), ("In 2023: 1,050.2", 1050.2, False),
    ("2023", 2023.0, False), (42, 42.0, False), (-0.5, -0.5, False), ("750k", 0.75, False),
])
def test_answers_parse(text, value, percent):
    parsed = parse_answer(text)
    assert parsed is not None and parsed.value == pytest.approx(value) and parsed.percent is percent


@pytest.mark.parametrize("text", ["9" * 200_000, "1" + ",000" * 50_000 + ",00", "(" * 100_000 + "1",
                                  "SELECT " + "'" * 19_990, "SELECT " + "/*" * 9_990, "SELECT 1" + ";" * 19_990,
                                  "SELECT " + "-- \n" * 4_990, "SELECT " + "[" * 19_990, " " * 19_999 + "S"])
def test_long_runs_are_read_in_bounded_time(text):
    # the answer parser and the statement check on runs of one character (the hostile cases that were slow
    # are in tests/faults/test_fault_hostile_servers.py)
    for read in (parse_answer, single_select):
        started = time.perf_counter()
        try:
            read(text)
        except Exception:  # noqa: BLE001 - refused or not, only the time matters here
            pass
        assert time.perf_counter() - started < 0.25, read.__name__


@pytest.mark.parametrize("text", ["", "twelve", "n/a", None, True, float("nan"), "1e308 billion", "-9e307 billion"])
def test_non_numbers_do_not_parse(text):
    assert parse_answer(text) is None


@pytest.mark.parametrize("answer, gold, unit, right", [
    ("12.5%", 12.5, "percent", True), ("12.5", 12.5, "percent", True), ("0.125", 12.5, "percent", True),
    ("0.125%", 12.5, "percent", False), ("12.6", 12.5, "percent", True), ("12.7", 12.5, "percent", False),
    ("45%", 0.45, "ratio", True), ("0.451", 0.45, "ratio", True), ("0.46", 0.45, "ratio", False),
    ("504", 500.0, "usd_millions", False),    # 0.8% off but 4.0 away: the absolute bound fails
    ("500.9", 500.0, "usd_millions", True), ("$0.5 billion", 500.0, "usd_millions", True),
    ("-12.5", 12.5, "usd_millions", False), ("0", 0.0, "usd_millions", True),
])
def test_correctness_tolerances(answer, gold, unit, right):
    assert is_correct(parse_answer(answer), gold, unit) is right


def test_wrong_and_unparseable_answers(env):
    task = env.tasks("eval-single", 1)[0]
    env.reset(task)
    wrong = env.step(ToolCall("submit_answer", {"answer": float(task.answer) * 2 + 10}))
    assert wrong.done and wrong.reward == pytest.approx(FORMAT) and wrong.info["correct"] is False
    assert wrong.info["gold"] == float(task.answer) and wrong.info["terms"] == {"correctness": 0.0, "format": FORMAT}
    env.reset(task)
    garbled = env.step(ToolCall("submit_answer", {"answer": "I could not find it"}))
    assert garbled.done and garbled.reward == 0.0 and garbled.info["parsed"] is None
    assert env.state()["submitted"] is True and env.state()["answer"] == "I could not find it"
    env.reset(task)
    right = env.step(ToolCall("submit_answer", {"answer": task.answer}))
    assert right.reward == pytest.approx(1 + FORMAT) and right.info["parsed"] == float(task.answer)


# --- episodes and rubric counters ------------------------------------------------------------------------

def test_turn_limit_ends_the_episode_with_zero(tmp_path):
    env = FinanceSQLEnv(seed=0, max_turns=3, db_dir=str(tmp_path))
    try:
        env.reset(env.tasks("train", 1)[0])
        for _ in range(2):
            assert not env.step(ToolCall("list_tables", {})).done
        last = env.step(ToolCall("run_sql", {"query": "SELECT 1"}))
        assert last.done and last.reward == 0.0 and "turn limit (3 tool calls)" in last.observation.content
        assert last.info["correct"] is False and last.info["reason"] == "turn_limit"
        late = env.step(ToolCall("submit_answer", {"answer": "1"}))
        assert late.done and late.reward == 0.0
        state = env.state()
        assert state["turns"] == 3 and state["done"] and not state["submitted"] and state["correct"] is False
    finally:
        env.close()


def test_counters_of_a_sloppy_episode(env):
    task = next(t for t in env.tasks("train") if t.meta["kind"] == "value")
    term = task.meta["terms"][0]
    env.reset(task)
    env.step(ToolCall("run_sql", {"query": f"SELECT {term['column']}_usd FROM {term['table']}"}))  # guesses first
    env.step(ToolCall("list_tables", {}))
    good = env.step(ToolCall("run_sql", {"query": compose_sql(task.meta)}))
    assert good.observation.metadata["rows"] == 1
    env.step(ToolCall("run_sql", {"query": "SELECT 1"}))  # a success after a success is no recovery
    final = env.step(ToolCall("submit_answer", {"answer": "not sure, maybe 3"}))
    state = env.state()
    assert state["tables_listed_before_query"] is False
    assert (state["hallucinated_columns"], state["hallucinated_tables"]) == (1, 0)
    assert (state["sql_errors"], state["recoveries"], state["turns"]) == (1, 1, 5)
    assert [c["ok"] for c in state["calls"]] == [False, True, True, True, True]
    assert state["submitted"] and state["answer"] == "not sure, maybe 3" and state["done"]
    assert state["correct"] is (float(task.answer) == 3.0) and state["reward"] == final.reward
    assert state["task_id"] == task.id


@pytest.mark.parametrize("call, says", [
    (ToolCall("drop_database", {}), "no tool 'drop_database'"),
    (ToolCall("run_sql", {}), "missing argument(s) query"),
    (ToolCall("run_sql", {"sql": "SELECT 1"}), "unknown argument(s) sql"),
    (ToolCall("describe_table", {"table": 3}), "must be a string"),
    (ToolCall("submit_answer", {"answer": ["1"]}), "must be a string or number"),
    (ToolCall("run_sql", "{not json"), "not valid JSON"),
])
def test_bad_calls_are_observations_and_turns(env, call, says):
    env.reset(env.tasks("train", 1)[0])
    result = env.step(call)
    assert says in result.observation.content and not result.done
    if "no tool" in says:
        listing = "list_tables(), describe_table(table), run_sql(query), submit_answer(answer)"
        assert listing in result.observation.content
    assert env.state()["turns"] == 1 and env.state()["calls"][0]["ok"] is False
    assert env.step(ToolCall("run_sql", '{"query": "SELECT 2"}')).observation.metadata["rows"] == 1


def test_close_removes_what_the_env_made(tmp_path):
    kept = FinanceSQLEnv(seed=0, db_dir=str(tmp_path))
    task = kept.tasks("train", 1)[0]
    path = kept.database_path(task)
    own = FinanceSQLEnv(seed=0)
    own.reset(task)
    folder = own.database_path(task).parent
    assert folder != tmp_path and folder.exists()
    own.close()
    kept.close()
    assert not folder.exists() and not path.exists()


def test_reset_and_steps_take_milliseconds(env):
    tasks = env.tasks("eval-multi")
    started = time.perf_counter()
    data.write_database(data.make_company(5, "train", 3), str(env.database_path(tasks[0]).parent / "x.sqlite"))
    assert time.perf_counter() - started < 0.5
    env.reset(tasks[0])  # writes the database once
    started = time.perf_counter()
    for task in tasks[:20]:
        env.reset(task)
        env.step(ToolCall("describe_table", {"table": "income_statement"}))
        env.step(ToolCall("run_sql", {"query": compose_sql(task.meta)}))
    assert (time.perf_counter() - started) / 20 < 0.05
