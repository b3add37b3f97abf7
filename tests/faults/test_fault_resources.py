"""Fault injection: a run too big for the machine is refused at admission, with the estimate and what to
change, before anything is written."""

import json

from strop.engine.resources import estimate_grpo_memory
from test_control import descriptor, home, run, workspace  # noqa: F401 - shared fixtures and helpers


def test_the_estimate_grows_with_what_a_step_holds(tiny_model_dir):
    small = estimate_grpo_memory(tiny_model_dir, batch_size=2, group_size=2, prompt_tokens=20, completion_tokens=8)
    wide = estimate_grpo_memory(tiny_model_dir, batch_size=8, group_size=8, prompt_tokens=20, completion_tokens=8)
    long = estimate_grpo_memory(tiny_model_dir, batch_size=2, group_size=2, prompt_tokens=20, completion_tokens=800)
    assert small["total"] < wide["total"] and small["total"] < long["total"]
    assert wide["activations"] > small["activations"] and long["kvCache"] > small["kvCache"]
    assert small["total"] == sum(v for k, v in small.items() if k not in ("total", "tokensPerMicroBatch", "completions"))


def test_a_run_that_would_not_fit_is_refused_at_admission(workspace, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "200")
    code, _, err = run(capsys, "runs", "start", "-f", descriptor(workspace))
    assert code == 1 and "$.config.rlHyperparams" in err and "GiB of memory" in err
    assert "Lower batchSize x groupSize or maxCompletionLength" in err
    assert json.loads(run(capsys, "runs", "list", "-o", "json")[1]) == []
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "64000")
    assert run(capsys, "runs", "start", "-f", descriptor(workspace), "--dry-run")[0] == 0


def test_strop_train_refuses_before_the_run_folder_exists(home, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "200")
    code, _, err = run(capsys, "train", "--base-model", "strop/tiny-random", "--steps", "1", "--run-dir", tmp_path / "run")
    assert code == 1 and "would need about" in err
    assert not (tmp_path / "run").exists()


def test_a_tight_budget_gets_smaller_micro_batches_not_a_refusal(tiny_model_dir, monkeypatch):
    from strop.engine.resources import plan_grpo_memory
    sizes = dict(batch_size=8, group_size=8, prompt_tokens=900, completion_tokens=100)
    roomy = plan_grpo_memory(tiny_model_dir, **sizes)
    # a budget that holds everything but half the activations of a full micro-batch
    budget = roomy["total"] - roomy["activations"] // 2
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", str(budget / (1 << 20)))
    tight = plan_grpo_memory(tiny_model_dir, **sizes)
    assert 1000 <= tight["tokensPerMicroBatch"] < roomy["tokensPerMicroBatch"] and tight["total"] <= budget
