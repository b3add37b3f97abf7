"""The LLM judge: verdicts held to a schema (json_schema for endpoints, grammar-constrained decoding for local
models), retries on bad verdicts, failures counted and never scored, agreement with exact grading."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from strop.evals.judge import (BUILTIN_METRICS, Judge, JudgeError, JudgeInput, judge_correct, judge_prompt,
                               metrics_from, parse_verdict, summarize_verdicts, verdict_schema)
from strop.serve import make_server

RUBRIC = metrics_from(None)
ITEMS = [JudgeInput(question=f"What is {a} + 2?", ground_truth=str(a + 2), response=f"{a} + 2 = {a + 2}. #### {a + 2}")
         for a in range(3)]


def test_the_default_rubric_is_seed_000s():
    assert [m.name for m in RUBRIC] == ["answer_correctness", "reasoning_quality"]
    prompt = judge_prompt(RUBRIC, ITEMS[0])
    assert "**Question:** What is 0 + 2?" in prompt and "**Ground Truth Answer:** 2" in prompt
    assert '"answer_correctness": <int>' in prompt and '"reasoning": "<one sentence>"' in prompt
    schema = verdict_schema(RUBRIC)
    assert schema["required"] == ["answer_correctness", "reasoning_quality", "reasoning"]
    assert schema["properties"]["reasoning_quality"] == {"type": "integer", "minimum": 0, "maximum": 5}
    assert schema["properties"]["reasoning"]["minLength"] == 1  # a verdict gives its reason


def test_a_verdict_without_a_reason_is_a_bad_verdict():
    for reply in ('{"answer_correctness": 5, "reasoning_quality": 4, "reasoning": ""}',
                  '{"answer_correctness": 5, "reasoning_quality": 4, "reasoning": "   "}',
                  '{"answer_correctness": 5, "reasoning_quality": 4}',
                  '{"answer_correctness": 5, "reasoning_quality": 4, "reasoning": 3}'):
        with pytest.raises(ValueError, match="reasoning is missing or empty"):
            parse_verdict(reply, RUBRIC)
    good = '{"answer_correctness": 1, "reasoning_quality": 1, "reasoning": "The answer is wrong."}'
    srv = scripted(['{"answer_correctness": 5, "reasoning_quality": 5, "reasoning": ""}', good])
    try:
        [verdict] = Judge(f"openai:j@http://127.0.0.1:{srv.server_port}/v1", retries=1, concurrency=1).judge_many(ITEMS[:1])
        assert verdict.attempts == 2 and verdict.reasoning == "The answer is wrong."  # asked again, not scored
    finally:
        srv.shutdown()
    srv = scripted(['{"answer_correctness": 5, "reasoning_quality": 5, "reasoning": ""}'])
    try:
        [verdict] = Judge(f"openai:j@http://127.0.0.1:{srv.server_port}/v1", retries=1, concurrency=1).judge_many(ITEMS[:1])
        assert verdict.scores is None and "reasoning is missing or empty" in verdict.error  # a failure, counted
        assert summarize_verdicts([verdict], RUBRIC)["failures"] == 1
    finally:
        srv.shutdown()


def test_verdicts_are_parsed_or_refused_with_the_reason():
    assert parse_verdict('{"answer_correctness": 5, "reasoning_quality": 4.0, "reasoning": "ok"}', RUBRIC) == \
        ({"answer_correctness": 5, "reasoning_quality": 4}, "ok")
    wrapped = 'Sure!\n```json\n{"answer_correctness": 0, "reasoning_quality": 1, "reasoning": "wrong"}\n```'
    assert parse_verdict(wrapped, RUBRIC)[0] == {"answer_correctness": 0, "reasoning_quality": 1}
    for reply, reason in [('{"answer_correctness": 7, "reasoning_quality": 1}', "outside 0-5"),
                          ('{"answer_correctness": "five", "reasoning_quality": 1}', "not an integer"),
                          ('{"reasoning_quality": 1}', "missing"), ("I think it is fine.", "no JSON object"),
                          ('{"answer_correctness": 5,', "no JSON object"), ("[1, 2]", "not a JSON object")]:
        with pytest.raises(ValueError, match=reason):
            parse_verdict(reply, RUBRIC)


def test_custom_metrics_from_a_config_and_their_errors():
    metrics = metrics_from(["answer_correctness", {"name": "math_reasoning", "type": "custom",
                                                   "prompt": "Check the arithmetic.\nScore 1-5.", "score_range": [1, 5]}])
    assert metrics[0] is BUILTIN_METRICS["answer_correctness"]
    assert (metrics[1].name, metrics[1].low, metrics[1].high, metrics[1].prompt) == \
        ("math_reasoning", 1, 5, "Check the arithmetic. Score 1-5.")
    for spec, reason in [({"name": "nope", "type": "builtin"}, "not built in"),
                         ({"name": "x", "type": "custom"}, "needs a prompt"),
                         ({"name": "x", "prompt": "p", "score_range": [5, 1]}, "score_range"),
                         ({"name": "bad name", "prompt": "p"}, "letters, digits"),
                         ({"name": "reasoning", "prompt": "p"}, "not 'reasoning'")]:
        with pytest.raises(JudgeError, match=reason):
            metrics_from([spec])


def test_agreement_with_exact_grading():
    from strop.evals.judge import Verdict
    correctness = BUILTIN_METRICS["answer_correctness"]
    assert judge_correct({"answer_correctness": 4}, correctness) and not judge_correct({"answer_correctness": 3}, correctness)
    verdicts = [Verdict(scores={"answer_correctness": s, "reasoning_quality": 2}) for s in (5, 0, 5, 1)]
    verdicts.append(Verdict(error="no JSON object", attempts=3))
    summary = summarize_verdicts(verdicts, RUBRIC, exact=[True, False, True, True, True])
    # judge says right/wrong/right/wrong; exact says right/wrong/right/right: observed 3/4, chance 1/2 -> kappa 0.5
    assert summary["kappa"] == pytest.approx(0.5)
    assert summary["failures"] == 1 and summary["judged"] == 4  # the failure is not scored as 0
    assert summary["means"] == {"answer_correctness": 2.75, "reasoning_quality": 2.0, "combined": 4.75}


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    srv = make_server(str(tiny_model_dir), port=0, name="tiny-judge")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"openai:tiny-judge@http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()
    srv.server_close()


def test_judge_through_strop_serve_with_the_real_client(served):
    judge = Judge(served, retries=0)
    verdicts = judge.judge_many(ITEMS)
    # a random model writes only valid verdicts because the server holds it to the schema
    assert [v.error for v in verdicts] == [None] * 3
    for v in verdicts:
        assert set(v.scores) == {"answer_correctness", "reasoning_quality"} and v.reasoning
        assert all(0 <= s <= 5 for s in v.scores.values()) and v.attempts == 1
    assert judge.schema_enforced


def test_local_judge_decodes_under_the_grammar(tiny_model_dir):
    judge = Judge(str(tiny_model_dir), metrics_from(["answer_correctness", {"name": "tidy", "prompt": "Is it tidy?",
                                                                           "score_range": [1, 3]}]), retries=0)
    verdicts = judge.judge_many(ITEMS)
    assert all(v.error is None for v in verdicts), [v.error for v in verdicts]
    assert all(1 <= v.scores["tidy"] <= 3 and 0 <= v.scores["answer_correctness"] <= 5 for v in verdicts)
    assert all(v.reasoning for v in verdicts)  # the grammar cannot write an empty reason


class _Scripted(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that answers from a script: bad verdicts first, or refuses json_schema."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        server.requests.append(body)
        if server.refuse_schema and "response_format" in body:
            payload = json.dumps({"error": {"message": "response_format is not supported", "type": "invalid_request_error"}})
            status = 400
        else:
            status, payload = 200, json.dumps({
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": server.replies[min(len(server.requests) - 1,
                                                                                                 len(server.replies) - 1)]}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args):
        pass


def scripted(replies, refuse_schema=False):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    srv.replies, srv.requests, srv.refuse_schema = replies, [], refuse_schema
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_bad_verdicts_are_retried_then_counted_as_failures():
    good = '{"answer_correctness": 5, "reasoning_quality": 3, "reasoning": "fine"}'
    srv = scripted(["not json", '{"answer_correctness": 9}', good])
    try:
        [verdict] = Judge(f"openai:j@http://127.0.0.1:{srv.server_port}/v1", retries=2, concurrency=1).judge_many(ITEMS[:1])
        assert verdict.scores == {"answer_correctness": 5, "reasoning_quality": 3} and verdict.attempts == 3
        assert srv.requests[0]["response_format"]["json_schema"]["schema"]["required"][0] == "answer_correctness"
        assert [r["temperature"] for r in srv.requests] == [0.0, 0.7, 0.7]
    finally:
        srv.shutdown()
    srv = scripted(["never a verdict"])
    try:
        [verdict] = Judge(f"openai:j@http://127.0.0.1:{srv.server_port}/v1", retries=1).judge_many(ITEMS[:1])
        assert verdict.scores is None and verdict.attempts == 2 and "no JSON object" in verdict.error
        assert verdict.combined is None
    finally:
        srv.shutdown()


def test_an_endpoint_without_json_schema_is_asked_in_plain_text():
    srv = scripted(['Here: {"answer_correctness": 2, "reasoning_quality": 2, "reasoning": "meh"}'], refuse_schema=True)
    try:
        judge = Judge(f"openai:j@http://127.0.0.1:{srv.server_port}/v1", retries=0, concurrency=1)
        [verdict] = judge.judge_many(ITEMS[:1])
        assert verdict.scores == {"answer_correctness": 2, "reasoning_quality": 2}
        assert not judge.schema_enforced and "response_format" not in srv.requests[-1]
    finally:
        srv.shutdown()



from test_control import home  # noqa: E402,F401 - a fresh STROP_HOME and store, shared


def test_an_evaluations_local_judge_reuses_the_generators_engine_only_for_its_own_model(home, tiny_model_dir,  # noqa: F811
                                                                                      tmp_path):
    """The evaluation worker hands its ServiceClient to the judge: a judge on the model that generated samples
    through the same engine (one vLLM start, not two); a judge on another model gets the generator's engine let
    go first, so the two are not held in memory together."""
    import shutil
    from types import SimpleNamespace

    import strop
    from strop.cli.main import main
    from strop.control.eval_worker import judge_items
    from strop.control.evaluations import resolve_model

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    for model in (tiny_model_dir, other):
        assert main(["base-models", "select", str(model), "--wait"]) == 0
    service = strop.ServiceClient()
    items = [SimpleNamespace(question="What is 1+1?", gold="2", response="1+1 is 2. #### 2", correct=True)]
    generated_on = resolve_model(str(tiny_model_dir))["basePath"]
    try:
        engine = service.backend.queue(generated_on).engine
        _, summary = judge_items({"model": str(tiny_model_dir), "retries": 0}, items, service=service,
                                 generated_on=generated_on)
        assert summary["judged"] + summary["failures"] == 1
        assert service.backend.queue(generated_on).engine is engine  # the judge sampled on the generator's engine
        judge_items({"model": str(other), "retries": 0}, items, service=service, generated_on=generated_on)
        assert list(service.backend._queues) == [str(service.backend.model_dir(resolve_model(str(other))["basePath"]))]
    finally:
        service.close()
