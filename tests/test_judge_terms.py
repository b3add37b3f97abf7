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
