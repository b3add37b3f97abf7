"""Numbers that would poison a run: a grader's 1e39, a NaN advantage, an adapter of NaNs. Each is an error that is
counted and reported; none reaches the weights, and no run ends "succeeded" with non-finite weights."""

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

from strop import types
from strop.client import ServiceClient
from strop.data import Row
from strop.errors import StropError
from strop.rl import GRPOConfig, run_grpo
from strop.rl.advantages import group_advantages
from strop.scoring import score_terms, terms_from_spec
from strop.scoring.sandbox import SandboxPool

from test_control import descriptor, home, run, workspace  # noqa: F401 - fixtures of the control plane's tests

ROW = Row("What is 2 + 2?", "2 + 2 = 4\n#### 4", {})
HUGE = "def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n    return 1e39\n"
HUGE_OR_NAN = ("def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
               "    return 1e39 if len(solution_str) % 2 else float('nan')\n")


def bundle(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "reward.py").write_text(body)
    return folder


# ---- scores out of range --------------------------------------------------------------------------------

def test_the_score_range():
    from strop.scoring.score_range import score_problem
    assert score_problem(1e6) is None and score_problem(-1e6) is None and score_problem(0.0) is None
    assert "outside the range" in score_problem(1e39) and "1,000,000" in score_problem(-1e7)
    assert score_problem(float("nan")) == "nan" and score_problem(float("-inf")) == "-inf"


def test_a_bundle_grader_returning_1e39_is_a_grader_error_and_rewards_stay_finite(tmp_path):
    """1e39 is finite in float64, so it was a score; in a step's float32 rewards it was infinity, and its group's
    advantages NaN."""
    pool = SandboxPool(timeout=30)
    try:
        terms = terms_from_spec([{"name": "huge", "grader": str(bundle(tmp_path / "huge", HUGE))},
                                 {"name": "format", "weight": 0.5, "grader": "builtin:gsm8k-format"}], sandbox=pool)
        scored = [score_terms(terms, text, ROW) for text in ("#### 4", "four")]
    finally:
        pool.close()
    for out in scored:
        assert out.scores["huge"] == 0.0 and len(out.errors) == 1
        assert "'huge'" in out.errors[0] and "1e+39" in out.errors[0] and "from -1,000,000 to 1,000,000" in out.errors[0]
    rewards_G = torch.tensor([out.total for out in scored])
    assert rewards_G.tolist() == [0.5, 0.0]
    assert torch.isfinite(group_advantages(rewards_G, scale_by_std=True)).all()


def test_a_run_whose_graders_return_1e39_or_nan_fails_at_its_first_step(tiny_model_dir, tmp_path):
    config = GRPOConfig(base_model=str(tiny_model_dir), dataset="synthetic:add", group_size=2, batch_size=2,
                        max_steps=3, max_completion_length=4, lora_rank=4,
                        reward_terms=[{"name": "bad", "grader": str(bundle(tmp_path / "bad", HUGE_OR_NAN))}])
    with pytest.raises(StropError, match=r"(?s)step 0: 4 of 4 grader calls failed.*'bad'.*returned (1e\+39|nan)"):
        run_grpo(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "final").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_a_background_run_whose_grader_returns_1e39_ends_failed(workspace, capsys, tmp_path):  # noqa: F811
    """The reported run: every reward 1e39, every adapter weight NaN, and the run 'succeeded'."""
    assert run(capsys, "registry", "bundles", "register", "arith/huge", "-f", bundle(tmp_path / "huge", HUGE))[0] == 0
    bad = descriptor(workspace, **{"config.reward.terms": [{"kind": "rule", "weight": 1.0, "bundle": "arith/huge",
                                                            "module": "reward"}]})
    code, out, _ = run(capsys, "runs", "start", "-f", bad, "--jq", ".runId")
    assert code == 0
    code, out, _ = run(capsys, "runs", "wait", out.strip(), "--timeout", "300", "-o", "json")
    info = json.loads(out)
    assert info["status"] == "failed" and info["modelId"] is None, info
    assert "grader calls failed" in info["error"] and "1e+39" in info["error"]


# ---- non-finite losses and gradients ----------------------------------------------------------------------

def datum(n: int, key: str, values: list[float]) -> types.Datum:
    inputs = {"target_tokens": types.TensorData.from_torch(torch.arange(1, n + 1)),
              key: types.TensorData.from_torch(torch.tensor(values))}
    if key == "advantages":
        inputs["logprobs"] = types.TensorData.from_torch(torch.full((n,), -1.0))
    return types.Datum(model_input=types.ModelInput.from_ints(list(range(2, n + 2))), loss_fn_inputs=inputs)


def lora(training) -> dict[str, torch.Tensor]:
    return training.trainer.lora_state_dict()


ADAM = types.AdamParams(learning_rate=1e-2)


@pytest.mark.parametrize("loss_fn, key, bad", [
    ("importance_sampling", "advantages", float("nan")),    # a NaN advantage passed through the Python API
    ("cross_entropy", "weights", float("inf")),              # weights made non-finite
])
def test_a_non_finite_loss_skips_the_update_and_is_counted(tiny_model_dir, loss_fn, key, bad):
    training = ServiceClient().create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)
    good = datum(6, key, [1.0] * 6)
    before = lora(training)
    fb = training.forward_backward([good, datum(6, key, [1.0, bad, 1.0, 0.0, 0.0, 1.0])], loss_fn=loss_fn).result()
    assert fb.metrics["nonfinite_loss:sum"] == 1.0 and math.isfinite(fb.metrics["loss:sum"])
    optim = training.optim_step(ADAM).result().metrics
    assert optim["skipped_nonfinite"] == 1.0 and optim["skipped_nonfinite_total"] == 1.0 and "grad_norm" not in optim
    after = lora(training)
    assert all(torch.equal(before[k], after[k]) for k in before)  # not a weight moved
    # the next update, of good datums, goes ahead as usual
    assert training.forward_backward([good], loss_fn=loss_fn).result().metrics["nonfinite_loss:sum"] == 0.0
    optim = training.optim_step(ADAM).result().metrics
    assert optim["skipped_nonfinite"] == 0.0 and math.isfinite(optim["grad_norm"]) and training.trainer.steps == 1
    trained = lora(training)
    assert any(not torch.equal(before[k], trained[k]) for k in before)
    assert all(torch.isfinite(t).all() for t in trained.values())


def test_an_update_that_would_make_a_weight_nan_is_undone(tiny_model_dir):
    """AdamW with eps 0 divides 0 by 0 where a weight's gradient is 0 (a LoRA A before B has moved): NaN weights
    from finite gradients. The step is put back and skipped."""
    training = ServiceClient().create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)
    before = lora(training)
    training.forward_backward([datum(6, "advantages", [1.0] * 6)], loss_fn="importance_sampling").result()
    optim = training.optim_step(types.AdamParams(learning_rate=1e-2, eps=0.0)).result().metrics
    assert optim["skipped_nonfinite"] == 1.0
    after = lora(training)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_an_adapter_of_nans_is_neither_saved_nor_loaded(tiny_model_dir, tmp_path):
    training = ServiceClient().create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)
    training.save_weights(str(tmp_path / "good")).result()
    name, param = next((n, p) for n, p in training.trainer.model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        param[0, 0] = float("nan")
    for save in (training.save_weights, training.save_state):
        with pytest.raises(StropError, match=r"cannot save .*1 of the adapter's tensors hold NaN or infinity"):
            save(str(tmp_path / "bad")).result()
    assert not (tmp_path / "bad").exists()
    # a file of NaNs written by something else: not loaded, not registered
    from safetensors.torch import load_file, save_file
    weights = tmp_path / "good" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors[next(iter(tensors))][0, 0] = float("inf")
    save_file(tensors, str(weights))
    with pytest.raises(StropError, match="cannot load the adapter"):
        ServiceClient().create_training_client_from_adapter(str(tiny_model_dir), tmp_path / "good")


def test_skipped_updates_fail_a_run_past_its_error_limit():
    from strop.rl.skipped import SkippedUpdates
    limit = SkippedUpdates(0.5)
    limit.count(0, updated=True, skipped=True)   # one at the start: chance
    limit.count(1, updated=False, skipped=True)  # nothing trained: no update to count
    limit.count(2, updated=True, skipped=True)
    with pytest.raises(StropError, match=r"step 3: 3 of the run's 3 updates so far were skipped .*more than the 50%"):
        limit.count(3, updated=True, skipped=True)
    short = SkippedUpdates(0.5)  # a 3-step run: 2 of its 3 updates skipped is past the limit at its end
    short.count(0, updated=True, skipped=False)
    short.count(1, updated=True, skipped=True)
    with pytest.raises(StropError, match="2 of the run's 3 updates"):
        short.count(2, updated=True, skipped=True, last=True)


# ---- a vLLM sampler where there is none ---------------------------------------------------------------

def no_vllm(monkeypatch, python: str | None):
    """vllm not importable here, and STROP_VLLM_PYTHON as given (None: unset)."""
    real = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    if python is None:
        monkeypatch.delenv("STROP_VLLM_PYTHON", raising=False)
    else:
        monkeypatch.setenv("STROP_VLLM_PYTHON", python)


@pytest.mark.parametrize("python, said", [
    (None, "this environment does not have"),
    ("/nowhere/python", "STROP_VLLM_PYTHON='/nowhere/python' is not an executable Python"),
    (sys.executable, "has no vllm"),  # a Python that runs, without vllm (the tests' own has none)
])
def test_a_vllm_descriptor_without_vllm_is_refused_at_admission(workspace, capsys, monkeypatch, python, said):  # noqa: F811
    if python == sys.executable and importlib.util.find_spec("vllm") is not None:
        pytest.skip("this Python has vllm")
    no_vllm(monkeypatch, python)
    code, out, err = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"execution.sampler": "vllm"}))
    assert code == 1 and out == ""
    assert "$.execution.sampler" in err and said in err and 'pip install -e ".[vllm]"' in err
    assert json.loads(run(capsys, "runs", "list", "-o", "json")[1]) == []


def test_strop_train_with_sampler_vllm_fails_before_loading_the_model(capsys, monkeypatch, tmp_path):
    no_vllm(monkeypatch, "/nowhere/python")
    monkeypatch.setenv("STROP_SAMPLER", "auto")  # --sampler sets it for the command: put back after the test
    started = time.monotonic()
    code, _, err = run(capsys, "train", "--base-model", str(tmp_path / "no-such-model"), "--sampler", "vllm",
                       "--steps", "1", "--run-dir", str(tmp_path / "r"), "--quiet")
    assert code == 1 and "the sampler is vllm" in err and 'pip install -e ".[vllm]"' in err
    assert "no-such-model" not in err and not (tmp_path / "r").exists()  # no model was looked for
    assert time.monotonic() - started < 30


# ---- the same through the Tinker wire, and an environment's reward ----------------------------------------

@pytest.fixture()
def wire_sdk(tmp_path, monkeypatch):
    """A `strop serve-tinker` on loopback and the unmodified tinker SDK pointed at it."""
    pytest.importorskip("tinker", reason="the dev install brings the tinker SDK: pip install -e '.[dev]'")
    from test_tinker_wire import start
    server = start(tmp_path / "tinker")
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", "tml-alice")
    yield server
    server.stop()


def test_the_tinker_wire_skips_a_non_finite_update_and_says_so(wire_sdk):
    """Weights of 3e38 are finite, so the wire takes them; their loss overflows float32. The optim_step reply was a
    NaN grad_norm, which JSON cannot carry, and every adapter weight became NaN."""
    import tinker
    from tinker import types as wire

    client = tinker.ServiceClient().create_lora_training_client(base_model="strop/tiny-random", rank=4).result()
    tokens = [1, 5, 9, 13, 17, 21]

    def datum(weight: float):
        return wire.Datum(model_input=wire.ModelInput.from_ints(tokens[:-1]),
                          loss_fn_inputs={"target_tokens": tokens[1:], "weights": [weight] * (len(tokens) - 1)})

    before = client.forward([datum(1.0)], "cross_entropy").result(timeout=120).metrics["loss:sum"]
    fb = client.forward_backward([datum(3e38)], "cross_entropy").result(timeout=120)
    assert fb.metrics["nonfinite_loss:sum"] == 1.0
    optim = client.optim_step(wire.AdamParams(learning_rate=1e-2)).result(timeout=120)
    assert optim.metrics["skipped_nonfinite"] == 1.0 and "grad_norm" not in optim.metrics
    assert client.forward([datum(1.0)], "cross_entropy").result(timeout=120).metrics["loss:sum"] == before


class HugeRewardEnv:
    """A one-tool environment whose every answer is rewarded 1e39 (finite in float64, infinite in float32)."""

    name, max_turns = "huge", 1

    def tools(self):
        return [{"type": "function", "function": {"name": "submit_answer", "parameters": {"type": "object"}}}]

    def reset(self, task):
        from strop.envs.base import Observation
        return Observation("answer")

    def step(self, call):
        from strop.envs.base import Observation, StepResult
        return StepResult(observation=Observation("done"), reward=1e39, done=True)

    def state(self):
        return {}


def test_an_environments_reward_of_1e39_is_an_environment_error():
    from strop.envs.base import Task
    from strop.rl.episodes import ToolEpisode

    episode = ToolEpisode(HugeRewardEnv(), Task(id="t", prompt="answer", answer="4", split="train"))
    episode.start()
    assert episode.act('<tool_call>{"name": "submit_answer", "arguments": {}}</tool_call>') is None
    rollout = episode.finish([], [])
    assert rollout.reward == 0.0 and rollout.failed == 1
    assert "'huge' gave the reward 1e+39" in rollout.errors[0] and "1,000,000" in rollout.errors[0]
