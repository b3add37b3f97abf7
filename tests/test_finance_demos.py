"""Demonstrations for a supervised warm start: transcripts the environment itself scores correct, some with a
mistake and its recovery, from the train split only."""

import json

import pytest

from strop.cli.main import main
from strop.envs.base import ToolCall
from strop.envs.finance_demos import demonstrations
from strop.envs.finance_sql import FinanceSQLEnv
from strop.errors import StropError
from test_control import home  # noqa: F401 - a fresh STROP_HOME

TOOL_NAMES = {"list_tables", "describe_table", "run_sql", "submit_answer"}


def replay(messages: list[dict], companies: int = 3) -> tuple[float, dict, dict]:
    """Every tool call of a transcript, run again in a fresh environment: (reward, final state, its task)."""
    env = FinanceSQLEnv(seed=0, companies=companies)
    try:
        task_id = None
        reward = 0.0
        for message in messages:
            for call in message.get("tool_calls") or []:
                if task_id is None:
                    raise AssertionError("a call before the task was read")
                result = env.step(ToolCall(call["function"]["name"], json.loads(call["function"]["arguments"])))
                reward = result.reward
            if message["role"] == "user":
                task = next(t for t in env.tasks("train") if t.prompt in message["content"])
                env.reset(task)
                task_id = task.id
        return reward, env.state(), task
    finally:
        env.close()


def test_demonstrations_are_transcripts_the_environment_scores_correct():
    env = FinanceSQLEnv(seed=0, companies=3)
    try:
        demos = list(demonstrations(env, n=60, mistakes=0.3, seed=1))
    finally:
        env.close()
    assert len(demos) == 60 and all("/train/" in d["task"] for d in demos)
    assert 5 <= sum(d["mistake"] for d in demos) <= 35
    for demo in demos:
        roles = [m["role"] for m in demo["messages"]]
        assert roles[0] == "user" and set(roles) <= {"user", "assistant", "tool"}
        calls = [c for m in demo["messages"] for c in m.get("tool_calls") or []]
        assert {c["function"]["name"] for c in calls} <= TOOL_NAMES and calls[-1]["function"]["name"] == "submit_answer"
        assert calls[0]["function"]["name"] == "list_tables"   # discovery before any query
        for m in demo["messages"]:
            if m["role"] == "tool":
                assert any(c["id"] == m["tool_call_id"] for c in calls)
        reward, state, _ = replay(demo["messages"])
        assert state["correct"] is True and reward >= 1.0, demo["task"]
        assert state["tables_listed_before_query"] and state["hallucinated_columns"] + state["hallucinated_tables"] \
            == (1 if demo["mistake"] else 0)
        assert state["recoveries"] == (1 if demo["mistake"] else 0)   # a mistake is read and recovered from


def test_only_the_train_split_is_demonstrated(home, tmp_path, capsys):  # noqa: F811
    env = FinanceSQLEnv(seed=0)
    with pytest.raises(StropError, match="train split only"):
        next(demonstrations(env, split="eval-single", n=1))
    env.close()
    out = tmp_path / "demos.jsonl"
    assert main(["envs", "demos", "finance-sql", "--n", "5", "-o", str(out)]) == 0
    assert "wrote 5 demonstrations" in capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 5 and all(set(d) == {"messages", "tools", "task", "mistake", "reward"} for d in lines)
    before = out.read_text()
    assert main(["envs", "demos", "finance-sql", "--n", "5", "-o", str(out)]) == 1    # never over a file
    assert main(["envs", "demos", "finance-sql", "--split", "eval-multi", "-o", str(tmp_path / "x.jsonl")]) == 1
    assert main(["envs", "demos", "toy", "-o", str(tmp_path / "y.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "exists" in err and "train split only" in err and "finance-sql only" in err
    assert out.read_text() == before and sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["demos.jsonl"]


def test_the_scripted_query_answers_every_question_of_every_split():
    """One SELECT with a subquery per stored value computes the answer, so a model only copies the number the
    database returned: the pattern holds for the unseen splits too, multi-table questions included."""
    import random

    from strop.envs.finance_demos import play_demonstration
    env = FinanceSQLEnv(seed=0)
    try:
        for split in env.splits():
            for task in env.tasks(split):
                demo = play_demonstration(env, task, mistake=False, rng=random.Random(0))
                assert demo["state"]["correct"] is True, (split, task.id)
                [query] = [json.loads(c["function"]["arguments"])["query"] for m in demo["messages"]
                           for c in m.get("tool_calls") or [] if c["function"]["name"] == "run_sql"]
                shown = demo["messages"][-3]["content"]   # the query's result, which the answer copies
                submitted = json.loads(demo["messages"][-2]["tool_calls"][0]["function"]["arguments"])["answer"]
                assert submitted.rstrip("%") == shown.splitlines()[1] and query.startswith("SELECT")
    finally:
        env.close()


def test_a_mistake_is_shown_but_not_trained_and_companies_spread_the_tasks(home, tiny_model_dir, tmp_path,  # noqa: F811
                                                                         capsys):
    """The deliberate mistake's assistant turn carries "weight": 0: the SFT datum built from the file gives its
    tokens zero loss weight, while the error it caused stays in the context and the recovery is trained.
    --companies spreads the tasks over that many training companies, and each transcript still replays correct."""
    from strop import model_info
    from strop.renderers import get_renderer
    from strop.sft.data import load_examples
    from strop.sft.loop import example_datum
    from strop.tokenizer_utils import get_tokenizer

    out = tmp_path / "demos.jsonl"
    assert main(["envs", "demos", "finance-sql", "--n", "16", "--mistakes", "1", "--companies", "5",
                 "-o", str(out)]) == 0
    assert "from 5 of 5 training companies" in capsys.readouterr().out
    demos = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(demos) == 16 and all(d["mistake"] for d in demos)
    assert {d["task"].split("/")[3] for d in demos} == {f"c{i}" for i in range(5)}   # train companies c0..c4
    wrong_queries = []
    for demo in demos:
        assistant = [m for m in demo["messages"] if m["role"] == "assistant"]
        untrained = [m for m in assistant if m.get("weight", 1) == 0]
        [mistake] = untrained                                  # one turn, and it is the mistaken query
        at = demo["messages"].index(mistake)
        assert demo["messages"][at + 1]["content"].startswith("Error")   # its error stays in the transcript
        wrong_queries.append(json.loads(mistake["tool_calls"][0]["function"]["arguments"])["query"])
        reward, state, _ = replay(demo["messages"], companies=5)
        assert state["correct"] is True and reward >= 1.0 and state["recoveries"] == 1, demo["task"]

    renderer = get_renderer(model_info.get_recommended_renderer_name(str(tiny_model_dir)),
                            get_tokenizer(str(tiny_model_dir)))
    examples = load_examples(out, renderer, max_seq_length=8192)
    for example, demo, wrong in zip(examples, demos, wrong_queries):
        datum = example_datum(example)
        targets = datum.loss_fn_inputs["target_tokens"].to_torch().tolist()
        weights = datum.loss_fn_inputs["weights"].to_torch().tolist()
        trained = renderer.tokenizer.decode([t for t, w in zip(targets, weights) if w])
        shown = renderer.tokenizer.decode([t for t, w in zip(targets, weights) if not w])
        right = [json.loads(c["function"]["arguments"])["query"] for m in demo["messages"]
                 for c in m.get("tool_calls") or [] if c["function"]["name"] == "run_sql"][-1]
        assert json.dumps(wrong) not in trained and json.dumps(wrong) in shown   # read as context, never learnt
        assert json.dumps(right) in trained and "submit_answer" in trained and "list_tables" in trained
        assert "Error" in shown and "Error" not in trained


def test_companies_out_of_range_or_too_few_for_n_are_refused(home, tmp_path, capsys):  # noqa: F811
    assert main(["envs", "demos", "finance-sql", "--companies", "0", "-o", str(tmp_path / "a.jsonl")]) == 1
    assert main(["envs", "demos", "finance-sql", "--companies", "81", "-o", str(tmp_path / "b.jsonl")]) == 1
    assert main(["envs", "demos", "finance-sql", "--n", "400", "--companies", "1", "-o", str(tmp_path / "c.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.count("--companies must be from 1 to 80") == 2 and "raise --companies or lower --n" in err
    assert not [p for p in tmp_path.iterdir() if p.name != "home"]
