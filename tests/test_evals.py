"""The evaluation runner: per-item records, accuracy, pass@k against hand-computed values; endpoints through the
real openai client over loopback (URL checks, retries with backoff, an unreachable server)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from strop.data import Row
from strop.errors import StropError
from strop.evals import evaluate_local, pass_at_k, summarize
from strop.evals.openai_client import evaluate_openai, parse_openai_ref
from strop.evals.runner import EvalItem
from loopback import chat_completion, closed_port, send_json


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)          # 1 - C(3,1)/C(4,1) = 1 - 3/4
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)           # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 4) == 1.0                          # only 3 wrong: any 4 include a right one


def test_summary_counts():
    def item(i, score, extracted):
        return EvalItem(index=i, question="q", gold="1", response="r", extracted=extracted, score=score,
                        correct=score >= 1.0, tokens=10 + i, latency_s=0.1)
    s = summarize([item(0, 1.0, "1"), item(1, 0.0, None), item(2, 1.1, "1"), item(3, 0.1, "2")])
    assert s["n"] == 4 and s["accuracy"] == 0.5 and s["parseFailures"] == 1
    assert s["meanScore"] == pytest.approx((1.0 + 0 + 1.1 + 0.1) / 4) and s["meanTokens"] == 11.5


def test_local_evaluation_records_every_item(tiny_model_dir, tmp_path):
    (tmp_path / "reward.py").write_text(
        "def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
        "    return 1.0 if len(solution_str) % 2 == 0 else 0.0\n")
    rows = [Row(question=f"What is {a} + 1?", answer=f"#### {a + 1}") for a in range(5)]
    result = evaluate_local(str(tiny_model_dir), rows, str(tmp_path), max_tokens=6)
    assert [i.index for i in result.items] == list(range(5))
    assert all(0 < i.tokens <= 6 and i.gold == str(n + 1) for n, i in enumerate(result.items))
    assert result.summary["accuracy"] == sum(len(i.response) % 2 == 0 for i in result.items) / 5
    again = evaluate_local(str(tiny_model_dir), rows, str(tmp_path), max_tokens=6)
    assert [i.response for i in again.items] == [i.response for i in result.items]  # greedy is repeatable
    k = evaluate_local(str(tiny_model_dir), rows, str(tmp_path), max_tokens=6, samples=4)
    assert "pass@4" in k.summary and k.summary["pass@4"] >= k.summary["pass@1"]


# --- OpenAI-compatible endpoints ---------------------------------------------------------------------------


def test_endpoint_urls_are_checked_up_front():
    assert parse_openai_ref("openai:big@http://127.0.0.1:8000/v1/").base_url == "http://127.0.0.1:8000/v1"
    for ref, reason in [("openai:x@http://", "names no host"), ("openai:x@http://exa mple.com/v1", "has a space"),
                        ("openai:x@http://localhost:99999/v1", "bad port"), ("openai:x@http://h:0/v1", "bad port"),
                        ("openai:x@ftp://h/v1", "http:// or https://"), ("openai:x", "no model name or no URL")]:
        with pytest.raises(StropError, match=reason) as err:
            parse_openai_ref(ref)
        assert str(err.value).count("\n") == 0 and ref in str(err.value)  # one clear line naming the input


class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 to the first `server.failures` requests, then a right answer."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.arrivals.append(time.monotonic())
        if len(self.server.arrivals) <= self.server.failures:
            status, payload = 503, {"error": {"message": "overloaded", "type": "server_error"}}
        else:
            status, payload = 200, chat_completion(body["model"], {"content": "1 + 1 = 2. #### 2"}, completion_tokens=9)
        send_json(self, status, payload)

    def log_message(self, *args):
        pass


def test_a_failing_request_is_retried_with_backoff_by_the_real_client():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    srv.arrivals, srv.failures = [], 2
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        result = evaluate_openai(f"openai:big@http://127.0.0.1:{srv.server_port}/v1", [Row("What is 1 + 1?", "#### 2")],
                                 "builtin:gsm8k", max_retries=2, concurrency=1, timeout=10)
    finally:
        srv.shutdown()
        srv.server_close()
    [item] = result.items
    assert len(srv.arrivals) == 3 and item.error is None and item.correct and item.tokens == 9
    first, second = srv.arrivals[1] - srv.arrivals[0], srv.arrivals[2] - srv.arrivals[1]
    # the client waits 0.5 s then 1 s (less up to 25% jitter): exponential backoff, not a tight loop
    assert first >= 0.3 and second >= 0.7 and result.summary["requestErrors"] == 0


def test_an_unreachable_endpoint_fails_every_item_with_its_reason():
    from strop.control.eval_worker import all_requests_failed
    ref = f"openai:big@http://127.0.0.1:{closed_port()}/v1"
    rows = [Row(f"What is {a} + 1?", f"#### {a + 1}") for a in range(3)]
    result = evaluate_openai(ref, rows, "builtin:gsm8k", max_retries=0, timeout=5)
    assert result.summary["requestErrors"] == 3 and "Connection" in result.summary["requestErrorExamples"][0]
    failure = all_requests_failed(ref, result.items)
    assert "every request to " + ref in str(failure) and "(3 of 3)" in str(failure) and "Connection" in str(failure)
    assert all_requests_failed(ref, result.items[:0]) is None
