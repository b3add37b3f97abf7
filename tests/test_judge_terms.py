"""LLM-judge reward terms (issue 40, item 6): a real local judge under the JSON grammar, and clear refusals."""

import threading

import pytest

from strop.errors import StropError
from strop.scoring import score_terms, terms_from_spec
from strop.scoring.judge_terms import JudgeGrader, judge_form_problem
from strop.serve import make_server


class Row:
    question = "What is 3 + 4?"
    answer = "7"
    extra: dict = {}


def test_local_judge_scores_in_0_1_and_caches_the_pair(tiny_model_dir):
    [term] = terms_from_spec([{"name": "j", "weight": 0.5,
                               "judge": {"rubric": "Is the answer correct?", "judge": f"local:{tiny_model_dir}"}}])
    first = score_terms([term], "3 + 4 = 7", Row())
    assert first.errors == []
    assert 0.0 <= first.scores["j"] <= 1.0 and first.total == pytest.approx(0.5 * first.scores["j"])
    # the verdict is a tenth of an integer 0..10
    assert round(first.scores["j"] * 10, 9) == int(round(first.scores["j"] * 10))
    again = score_terms([term], "3 + 4 = 7", Row())
    assert again.scores == first.scores
    assert (term.fn.calls, term.fn.cache_hits, term.fn.failures) == (1, 1, 0)
    score_terms([term], "it is 8", Row())
    assert (term.fn.calls, term.fn.cache_hits) == (2, 1)


def test_an_unreachable_endpoint_counts_as_a_grader_error():
    # a closed loopback port: the request fails, the term scores 0.0 and the failure is listed like a grader's
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [term] = terms_from_spec([{"judge": {"rubric": "Correct?", "judge": f"openai:j@http://127.0.0.1:{port}/v1",
                                         "timeout": 2}}])
    scores = score_terms([term], "7", Row())
    assert scores.scores == {"judge": 0.0} and len(scores.errors) == 1
    assert "gave no verdict" in scores.errors[0] and term.fn.failures == 1


@pytest.mark.parametrize("spec, says", [
    ({"judge": {"judge": "local"}}, "needs a rubric"),
    ({"judge": {"rubric": "ok?", "judge": "gpt4"}}, "is not a judge form"),
    ({"judge": {"rubric": "ok?", "judge": "openai:x"}}, "no model name or no URL"),
    ({"judge": {"rubric": "ok?", "judge": "local:"}}, "names no model"),
    ({"judge": {"rubric": "ok?", "timeout": 0}}, "timeout must be a positive"),
    ({"judge": {"rubric": "ok?", "temp": 1}}, "unknown judge key"),
    ({"weight": "x", "judge": {"rubric": "ok?"}}, "weight must be a finite number"),
    ({"judge": "local"}, "'judge' must be a mapping"),
])
def test_bad_judge_terms_are_refused_clearly(spec, says):
    with pytest.raises(StropError, match=says):
        terms_from_spec([spec])


def test_judge_forms():
    assert judge_form_problem("local") is None and judge_form_problem("openai:m@http://127.0.0.1:1/v1") is None
    assert "not a judge form" in judge_form_problem("remote")
    with pytest.raises(StropError, match="needs a rubric"):
        JudgeGrader("  ", "local")


def test_a_served_endpoint_judges_through_the_real_client(tiny_model_dir):
    # `strop serve` on loopback holds the tiny model to the verdict schema; the openai client asks it
    srv = make_server(str(tiny_model_dir), port=0, name="tiny-judge")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        [term] = terms_from_spec([{"name": "served", "judge": {
            "rubric": "Is the answer correct?", "judge": f"openai:tiny-judge@http://127.0.0.1:{srv.server_port}/v1"}}])
        first = score_terms([term], "3 + 4 = 7", Row())
        assert first.errors == [] and 0.0 <= first.scores["served"] <= 1.0
        assert score_terms([term], "3 + 4 = 7", Row()).scores == first.scores
        assert (term.fn.calls, term.fn.cache_hits, term.fn.failures) == (1, 1, 0) and term.fn.seconds > 0
    finally:
        srv.shutdown()
        srv.server_close()


# ---- group mode (RULER-style): a group's completions scored against each other in one call ----------------------

class ScriptedJudge:
    """An OpenAI-compatible judge on loopback (a real HTTP server, read by the real openai client) whose verdict
    follows a rule known in advance: a response containing "= 7" scores 9, any other 2. It keeps each request."""

    def __init__(self, reply=None, delay: float = 0.0):
        import json
        import time
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from loopback import chat_completion, send_json
        self.requests = []
        self.in_flight = self.most_in_flight = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                with lock:
                    outer.in_flight += 1
                    outer.most_in_flight = max(outer.most_in_flight, outer.in_flight)
                time.sleep(delay)  # a judge that takes its time: calls that overlap show here
                with lock:
                    outer.in_flight -= 1
                text = body["messages"][0]["content"]
                parts = text.split("### Response ")[1:]
                verdict = {f"response_{k}": 9 if "= 7" in part else 2 for k, part in enumerate(parts, 1)}
                content = reply if reply is not None else json.dumps({**verdict, "reasoning": "by the rule"})
                send_json(self, 200, chat_completion(body["model"], {"content": content}))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted_judge():
    judge = ScriptedJudge()
    yield judge
    judge.close()


def group_term(url: str, **spec):
    [term] = terms_from_spec([{"name": "rank", "weight": 0.5, "judge": {
        "rubric": "Which answers are correct?", "judge": f"openai:j@{url}", "mode": "group", **spec}}])
    return term


def test_a_group_judge_scores_the_whole_group_in_one_call(scripted_judge):
    term = group_term(scripted_judge.url)
    completions = ["3 + 4 = 7", "it is 8", "so 3 + 4 = 7 again"]
    assert term.fn.score_group("What is 3 + 4?", "7", completions) == [0.9, 0.2, 0.9]
    [request] = scripted_judge.requests
    prompt = request["messages"][0]["content"]
    # one message holding the task, the reference, the rubric and every response, numbered
    assert "**Task:** What is 3 + 4?" in prompt and "**Reference answer (may be empty):** 7" in prompt
    assert "Which answers are correct?" in prompt and "### Response 3\nso 3 + 4 = 7 again" in prompt
    schema = request["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["response_1", "response_2", "response_3", "reasoning"]
    assert schema["properties"]["response_2"] == {"type": "integer", "minimum": 0, "maximum": 10}
    # the same group again: from the cache; a different one: a second call
    assert term.fn.score_group("What is 3 + 4?", "7", completions) == [0.9, 0.2, 0.9]
    term.fn.score_group("What is 3 + 4?", "7", ["8", "= 7"])
    assert len(scripted_judge.requests) == 2
    stats = term.fn.stats()
    assert (stats["calls"], stats["cacheHits"], stats["failures"]) == (2, 1, 0) and stats["seconds"] > 0


def test_a_large_group_is_judged_in_parts_and_long_responses_are_cut(scripted_judge):
    from strop.scoring.judge_terms import GROUP_MAX, RESPONSE_CHARS
    term = group_term(scripted_judge.url)
    completions = ["= 7" if k % 3 == 0 else "no" for k in range(GROUP_MAX + 4)]
    completions[1] = "x" * (RESPONSE_CHARS + 500) + " = 7"   # its "= 7" is past the cut: the judge never sees it
    scores = term.fn.score_group("q", "7", completions)
    assert scores == [0.9 if k % 3 == 0 else 0.2 for k in range(GROUP_MAX + 4)]
    assert [len(r["messages"][0]["content"].split("### Response ")) - 1 for r in scripted_judge.requests] == [GROUP_MAX, 4]
    assert f"[cut: {RESPONSE_CHARS + 504:,} characters" in scripted_judge.requests[0]["messages"][0]["content"]


def test_group_terms_are_scored_once_the_group_is_complete(scripted_judge):
    from strop.rl.episodes import ProblemSource
    from strop.rl.types import Rollout, Turn
    from strop import types
    length = {"name": "short", "weight": 1.0, "grader": "builtin:gsm8k-format"}
    terms = terms_from_spec([length]) + [group_term(scripted_judge.url)]
    # reply by reply, only the rule term is scored: the group term waits for the group
    first = score_terms(terms, "3 + 4 = 7\n#### 7", Row())
    assert set(first.scores) == {"short"} and first.errors == [] and scripted_judge.requests == []
    source = ProblemSource(terms)
    turn = lambda text: Turn(prompt=types.ModelInput.from_ints([1]), tokens=(2,), logprobs=(0.0,), text=text)  # noqa: E731
    group = tuple(Rollout(turns=(turn(text),), reward=0.25, scores={"short": 0.25}, question=Row.question, gold="7",
                          checks=2) for text in ("3 + 4 = 7", "8"))
    [scored] = source.score_groups([group])
    assert [r.scores for r in scored] == [{"short": 0.25, "rank": 0.9}, {"short": 0.25, "rank": 0.2}]
    assert [r.reward for r in scored] == pytest.approx([0.25 + 0.5 * 0.9, 0.25 + 0.5 * 0.2])
    assert len(scripted_judge.requests) == 1 and all(r.failed == 0 for r in scored)
    # what the judge cost, per step: the calls since the last report
    row = source.metrics(list(scored))
    assert (row["judgeCalls"], row["judgeCacheHits"], row["judgeFailures"]) == (1, 0, 0) and row["judgeSeconds"] > 0
    source.score_groups([group])
    again = source.metrics(list(scored))
    assert (again["judgeCalls"], again["judgeCacheHits"]) == (0, 1)


def test_a_steps_groups_are_judged_side_by_side_and_kept_in_order():
    from strop.rl.episodes import ProblemSource
    from strop.rl.types import Rollout, Turn
    from strop import types
    judge = ScriptedJudge(delay=0.3)
    try:
        source = ProblemSource([group_term(judge.url)])
        turn = lambda text: Turn(prompt=types.ModelInput.from_ints([1]), tokens=(2,), logprobs=(0.0,), text=text)  # noqa: E731
        groups = [tuple(Rollout(turns=(turn(text),), reward=0.0, scores={}, question=f"q{g}", gold="7", checks=1)
                        for text in (["= 7", "8"] if g % 2 else ["8", "= 7"])) for g in range(4)]
        scored = source.score_groups(groups)
        # each group its own verdict, in the groups' order, though the 4 calls overlapped
        assert [[r.scores["rank"] for r in group] for group in scored] == [[0.2, 0.9], [0.9, 0.2]] * 2
        assert [g[0].question for g in scored] == ["q0", "q1", "q2", "q3"] and len(judge.requests) == 4
        assert judge.most_in_flight > 1
    finally:
        judge.close()


def test_a_group_judge_that_fails_scores_the_group_0_and_is_counted():
    from loopback import closed_port
    from strop.rl.episodes import ProblemSource
    from strop.rl.types import Rollout
    bad = ScriptedJudge(reply='{"response_1": 11, "response_2": 3, "reasoning": "out of range"}')
    try:
        for url in (f"http://127.0.0.1:{closed_port()}/v1", bad.url):
            source = ProblemSource([group_term(url, timeout=2)])
            group = (Rollout(question="q", gold="7", checks=1), Rollout(question="q", gold="7", checks=1))
            [scored] = source.score_groups([group])
            assert [r.scores for r in scored] == [{"rank": 0.0}] * 2 and [r.reward for r in scored] == [0.0, 0.0]
            assert [r.failed for r in scored] == [1, 1]
            assert "could not score the group" in scored[0].errors[0] and "gave no verdict" in scored[0].errors[0]
            assert source.metrics(list(scored))["judgeFailures"] == 1
        assert "response_1 = 11 is outside 0-10" in scored[0].errors[0]
    finally:
        bad.close()


def test_a_local_group_judge_holds_to_the_grammar(tiny_model_dir):
    [term] = terms_from_spec([{"judge": {"rubric": "Correct?", "judge": f"local:{tiny_model_dir}", "mode": "group"}}])
    scores = term.fn.score_group("What is 3 + 4?", "7", ["7", "8", "3 + 4 = 7"])
    # a random model, held to the schema: three tenths of integers 0..10
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 and round(s * 10, 9) == int(round(s * 10)) for s in scores)
    # a step's groups, judged side by side by the one local sampler: each held to the grammar too
    from strop.rl.episodes import ProblemSource
    from strop.rl.types import Rollout, Turn
    from strop import types
    turn = lambda text: Turn(prompt=types.ModelInput.from_ints([1]), tokens=(2,), logprobs=(0.0,), text=text)  # noqa: E731
    groups = [tuple(Rollout(turns=(turn(f"{g} + {k}"),), question=f"What is {g} + 1?", gold=str(g + 1), checks=1)
                    for k in range(2)) for g in range(3)]
    scored = ProblemSource([term]).score_groups(groups)
    assert all(r.failed == 0 and 0.0 <= r.scores[term.name] <= 1.0 for group in scored for r in group)
    assert [g[0].question for g in scored] == ["What is 0 + 1?", "What is 1 + 1?", "What is 2 + 1?"]
    with pytest.raises(StropError, match="scores a group's completions together"):
        term.fn(solution_str="7", ground_truth="7", extra_info={})


def test_a_bad_mode_is_refused():
    with pytest.raises(StropError, match="mode must be one of pointwise, group, got 'rank'"):
        terms_from_spec([{"judge": {"rubric": "ok?", "mode": "rank"}}])
    with pytest.raises(StropError) as err:   # a 100 kB mode is named, not echoed
        terms_from_spec([{"judge": {"rubric": "ok?", "mode": "x" * 100_000}}])
    assert len(str(err.value)) < 300


def test_a_huge_task_is_cut_before_the_group_judge_reads_it(scripted_judge):
    from strop.scoring.judge_terms import RESPONSE_CHARS
    term = group_term(scripted_judge.url)
    assert term.fn.score_group("q" * 100_000, "7" * 50_000, ["= 7", "8"]) == [0.9, 0.2]
    prompt = scripted_judge.requests[0]["messages"][0]["content"]
    assert len(prompt) < 3 * RESPONSE_CHARS + 2_000 and "[cut: 100,000 characters" in prompt


def test_a_run_rewards_with_a_group_judge_and_reports_its_cost(tiny_model_dir, scripted_judge, tmp_path):
    import json
    from strop.rl.config import GRPOConfig
    from strop.rl.grpo import run_grpo
    config = GRPOConfig(base_model=str(tiny_model_dir), dataset="synthetic:add", group_size=3, batch_size=2,
                        max_steps=1, max_completion_length=6, lora_rank=4, save_every=1, keep_adapters=1,
                        reward_terms=[{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"},
                                      {"name": "rank", "weight": 0.5, "judge": {
                                          "rubric": "Correct?", "judge": f"openai:j@{scripted_judge.url}",
                                          "mode": "group"}}])
    [row] = run_grpo(config, tmp_path / "run", progress=False).metrics
    # one call per group of the step, each reading the group's three completions
    assert row["judgeCalls"] == 2 and row["judgeFailures"] == 0 and row["rewardErrors"] == 0
    assert [len(r["messages"][0]["content"].split("### Response ")) - 1 for r in scripted_judge.requests] == [3, 3]
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["scores"]["rank"] in (0.2, 0.9) for r in records)
    # the reward the advantages used includes the group term, at its weight
    assert row["reward/rank"] == pytest.approx(0.5 * sum(r["scores"]["rank"] for r in records) / 6)
