"""The evaluation runner: per-item records, accuracy, pass@k against hand-computed values."""

import pytest

from strop.data import Row
from strop.evals import evaluate_local, pass_at_k, summarize
from strop.evals.runner import EvalItem


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
