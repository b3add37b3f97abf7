"""The SFT mix (PPO-ptx): a run's optimizer steps add the cross-entropy of a few supervised transcripts to the
policy loss. Hand-worked first (the draw, the weights, the gradient the optimizer steps on), then the setting
through GRPOConfig, the run descriptor and `strop train`, then a tiny run that learns its transcripts."""

import hashlib
import json

import pytest
import torch

import strop
from strop import model_info, types
from strop.errors import StropError
from strop.renderers import get_renderer
from strop.rl import GRPOConfig, run_grpo
from strop.rl.sft_mix import SFTMix
from strop.rl.updates import apply_updates
from strop.rl.step import adam_params
from strop.tokenizer_utils import get_tokenizer
from test_control import descriptor, home, run, workspace  # noqa: F401 - the control-plane fixtures
from test_descriptor import problems, seed

MISTAKE = {"role": "assistant", "content": "SELECT revenues FROM income", "weight": 0}


def transcript(n: int, mistake: bool = False) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {n} + {n}?"},
                         *([MISTAKE, {"role": "user", "content": "no such table: income"}] if mistake else []),
                         {"role": "assistant", "content": f"{n} + {n} = {2 * n}. The answer is {2 * n}."}]}


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def renderer(tiny_model_dir):
    return get_renderer(model_info.get_recommended_renderer_name(str(tiny_model_dir)), get_tokenizer(str(tiny_model_dir)))


def mix_of(tmp_path, renderer, n=6, **settings) -> SFTMix:
    data = write(tmp_path / "mix.jsonl", [transcript(i, mistake=i == 0) for i in range(n)])
    return SFTMix.load(GRPOConfig(sft_mix=data, **settings), renderer)


def test_each_optimizer_step_draws_its_own_transcripts_weighted_by_the_mix(tmp_path, renderer):
    mix = mix_of(tmp_path, renderer, sft_mix_weight=0.25, sft_mix_examples=3, seed=7)
    first = mix.batch(step=2, update=0)
    assert len(first) == 3
    # seeded by the run's seed, the step and the optimizer step: a resumed run draws what the first one did
    again = mix_of(tmp_path, renderer, sft_mix_weight=0.25, sft_mix_examples=3, seed=7).batch(step=2, update=0)
    assert [d.model_input.to_ints() for d in first] == [d.model_input.to_ints() for d in again]
    draws = {tuple(tuple(d.model_input.to_ints()) for d in mix.batch(step, update))
             for step in range(6) for update in range(2)}
    assert len(draws) > 1  # steps do not all train on the same three
    # each trained token weighs the mix's weight, the rest nothing
    for datum in first:
        weights = set(datum.loss_fn_inputs["weights"].to_torch().tolist())
        assert weights == {0.0, 0.25}
    # fewer transcripts than examplesPerStep: every one of them, in file order
    every = mix_of(tmp_path, renderer, n=2, sft_mix_examples=5).batch(step=0)
    assert len(every) == 2 and every[0].model_input.length > every[1].model_input.length  # the first has the mistake


def test_a_mistake_marked_weight_0_is_not_trained_by_the_mix(tmp_path, renderer):
    mix = mix_of(tmp_path, renderer, n=1, sft_mix_weight=1.0, sft_mix_examples=1)
    [datum] = mix.batch(step=0)
    targets = datum.loss_fn_inputs["target_tokens"].to_torch().tolist()
    weights = datum.loss_fn_inputs["weights"].to_torch().tolist()
    trained = renderer.tokenizer.decode([t for t, w in zip(targets, weights) if w])
    untrained = renderer.tokenizer.decode([t for t, w in zip(targets, weights) if not w])
    assert "The answer is 0." in trained and "revenues" not in trained
    assert "SELECT revenues FROM income" in untrained


class Recorded:
    """A real training client whose optimizer step first keeps the gradient it is about to apply."""

    def __init__(self, training):
        self.training, self.seen = training, []

    def __getattr__(self, name):
        return getattr(self.training, name)

    def optim_step(self, adam):
        self.seen.append(gradient(self.training))
        return self.training.optim_step(adam)


def gradient(training) -> torch.Tensor:
    params = [p for p in training.trainer.model.parameters() if p.requires_grad]
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in params]).clone()


def policy_datum(renderer) -> types.Datum:
    tokens = renderer.tokenizer.encode("What is 2 + 2? The answer is 4.")
    n = len(tokens) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:])),
        "logprobs": types.TensorData.from_torch(torch.zeros(n)),
        "advantages": types.TensorData.from_torch(torch.tensor([0.0] * (n - 4) + [0.5] * 4))})


def test_the_optimizer_steps_on_the_policy_gradient_plus_the_weighted_cross_entropy_gradient(tmp_path, renderer,
                                                                                            tiny_model_dir):
    config = GRPOConfig(base_model=str(tiny_model_dir), sft_mix=write(tmp_path / "m.jsonl", [transcript(3)]),
                        sft_mix_weight=0.3, sft_mix_examples=1, learning_rate=1e-3)
    mix, datum = SFTMix.load(config, renderer), policy_datum(renderer)
    training = strop.ServiceClient().create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)
    # make the adapter's B non-zero so that both losses have a gradient on every LoRA weight
    with torch.no_grad():
        for p in training.trainer.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.02)
    training.forward_backward([datum], loss_fn="importance_sampling").result()
    policy = gradient(training)
    training.trainer.model.zero_grad(set_to_none=True)
    unscaled = SFTMix(mix.examples, 1.0, 1, config.seed).batch(step=0)
    ce = training.forward_backward(unscaled, loss_fn="cross_entropy").result().metrics["loss:sum"]
    supervised = gradient(training)
    training.trainer.model.zero_grad(set_to_none=True)

    recorded = Recorded(training)
    result = apply_updates(recorded, [datum], config, adam_params(config), {}, mix=mix, step=0)
    [stepped] = recorded.seen
    assert supervised.abs().sum() > 0 and policy.abs().sum() > 0
    torch.testing.assert_close(stepped, policy + 0.3 * supervised, rtol=1e-4, atol=1e-6)
    # its loss is reported per trained token, before the weight
    assert result.mix_loss == pytest.approx(ce / SFTMix.weighted_tokens(unscaled), rel=1e-4)


def test_the_setting_is_checked_and_reaches_the_config_from_every_front(tmp_path):
    with pytest.raises(StropError) as err:
        GRPOConfig(sft_mix=str(tmp_path / "missing.jsonl"), sft_mix_weight=0, sft_mix_examples=0)
    message = str(err.value)
    assert "sft_mix: " in message and "is not a file" in message
    assert "sft_mix_weight: must be a number greater than 0" in message
    assert "sft_mix_examples: must be an integer from 1 to 256" in message
    for hostile in ("x" * 100_000, "a\x00b", "", "/dev/zero"):  # too long to look up, a NUL, nothing, a device
        with pytest.raises(StropError, match="sft_mix: .* is not a file"):
            GRPOConfig(sft_mix=hostile)

    data = seed()
    path = write(tmp_path / "mix.jsonl", [transcript(1)])
    data["config"]["rlHyperparams"]["sftMix"] = {"data": path, "weight": 0.5, "examplesPerStep": 2}
    from strop.control import validate_descriptor
    run = validate_descriptor(data)
    config = run.to_grpo_config("/pinned/train.jsonl", run.reward_term_specs(["/pinned/b#reward:compute_score"]))
    assert (config.sft_mix, config.sft_mix_weight, config.sft_mix_examples) == (path, 0.5, 2)
    default = validate_descriptor(seed()).to_grpo_config("x.jsonl", [{"name": "c", "weight": 1.0,
                                                                      "grader": "builtin:gsm8k"}])
    assert (default.sft_mix, default.sft_mix_weight, default.sft_mix_examples) == (None, 0.1, 4)

    data["config"]["rlHyperparams"]["sftMix"] = {"data": path, "weight": -1, "examplesPerSteps": 2}
    found = problems(data)
    assert any(p.startswith("$.config.rlHyperparams.sftMix.weight: must be a number greater than 0") for p in found)
    assert any("did you mean 'examplesPerStep'" in p for p in found), found
    data["config"]["rlHyperparams"]["sftMix"] = {"weight": 0.5}
    assert any(p.startswith("$.config.rlHyperparams.sftMix") and 'give the file' in p for p in problems(data)), \
        problems(data)

    from strop.cli.main import build_parser
    train = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "--sft-mix FILE" in train and "--sft-mix-weight" in train and "--sft-mix-examples N" in train


def test_a_run_with_a_mix_learns_its_transcripts_and_reports_their_loss(tmp_path, tiny_model_dir):
    data = write(tmp_path / "mix.jsonl", [transcript(i) for i in range(4)])
    bundle = tmp_path / "lengthy"
    bundle.mkdir()  # a reward that differs between a random model's completions: every step has groups to learn
    (bundle / "reward.py").write_text("def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                      "extra_info=None):\n    return (len(solution_str) % 7) / 7.0\n")
    common = dict(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=4, max_steps=3,
                  batch_size=2, group_size=4, max_completion_length=8, learning_rate=5e-3, lora_rank=4,
                  reward_terms=[{"name": "len", "weight": 1.0, "grader": str(bundle)}], sandbox_graders=False)
    mixed = run_grpo(GRPOConfig(**common, sft_mix=data, sft_mix_weight=1.0, sft_mix_examples=4),
                     tmp_path / "mixed", progress=False)
    losses = [m["sftMixLoss"] for m in mixed.metrics]
    assert all(isinstance(v, float) for v in losses), mixed.metrics
    assert losses[-1] < losses[0]  # the same four transcripts each step: their loss falls as they are learnt
    plain = run_grpo(GRPOConfig(**common), tmp_path / "plain", progress=False)
    assert all(m.get("sftMixLoss") is None for m in plain.metrics)
    saved = json.loads((tmp_path / "mixed" / "config.json").read_text())
    assert (saved["sft_mix"], saved["sft_mix_examples"]) == (data, 4)


def test_a_bad_mix_file_is_refused_before_the_run_folder_exists(tmp_path, tiny_model_dir):
    common = dict(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=2, max_steps=1,
                  batch_size=1, group_size=2, max_completion_length=4, lora_rank=4)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(transcript(1)) + "\n{not json\n")
    with pytest.raises(StropError, match="line 2"):
        run_grpo(GRPOConfig(**common, sft_mix=str(broken)), tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()
    silent = write(tmp_path / "silent.jsonl", [{"messages": [{"role": "user", "content": "hi"}, MISTAKE]}])
    with pytest.raises(StropError, match="no transcript has a trained turn|every assistant turn"):
        run_grpo(GRPOConfig(**common, sft_mix=silent), tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()


def test_the_control_plane_pins_the_mix_by_content_from_a_registered_dataset_or_a_file(workspace, capsys):  # noqa: F811
    from strop.files import file_sha256
    demos = workspace / "demos.jsonl"
    write(demos, [transcript(i, mistake=i == 0) for i in range(3)])
    original = demos.read_bytes()
    code, out, err = run(capsys, "registry", "datasets", "register", "arith/demos", "-f", demos, "-o", "json")
    assert code == 0, err
    mix = {"weight": 0.5, "examplesPerStep": 2}

    def pinned_mix(data):
        path = descriptor(workspace, **{"config.rlHyperparams.sftMix": {"data": data, **mix}})
        code, out, err = run(capsys, "runs", "start", "-f", path, "--dry-run", "-o", "json")
        return code, (json.loads(out)["pinned"]["rl"]["sftMix"] if code == 0 else err)

    # a registered supervised dataset, by name: its latest version, by content
    code, pinned = pinned_mix("arith/demos")
    assert code == 0, pinned
    assert pinned == {"data": "arith/demos", "dataset": "arith/demos@1", "sha256": file_sha256(demos), **mix}
    # a question/answer dataset, a path that is neither, a file with a bad line: refused at admission, with the fix
    code, err = pinned_mix("arith/train")
    assert code == 1 and "sftMix.data: arith/train@1 is a question/answer dataset" in err
    code, err = pinned_mix(str(workspace / "missing.jsonl"))
    assert code == 1 and "is neither a registered dataset" in err and "strop registry datasets register" in err
    broken = workspace / "broken.jsonl"
    broken.write_text(json.dumps(transcript(1)) + "\n{not json\n")
    code, err = pinned_mix(str(broken))
    assert code == 1 and "sftMix.data:" in err and "line 2" in err

    # a file: stored when the run is admitted, so the run trains on what was admitted however the file changes
    path = descriptor(workspace, **{"config.rlHyperparams.sftMix": {"data": str(demos), **mix},
                                    "config.rlHyperparams.maxSteps": 1})
    code, out, err = run(capsys, "runs", "start", "-f", path, "-o", "json")
    assert code == 0, err
    started = json.loads(out)
    demos.write_text(json.dumps(transcript(9)) + "\n")  # edited after admission
    code, out, _ = run(capsys, "runs", "wait", started["runId"], "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    got = json.loads(run(capsys, "runs", "get", started["runId"], "-o", "json")[1])
    assert got["pinned"]["rl"]["sftMix"]["sha256"] == hashlib.sha256(original).hexdigest()
    config = json.loads(open(f"{got['runDir']}/config.json").read())
    assert open(config["sft_mix"], "rb").read() == original
    assert (config["sft_mix_weight"], config["sft_mix_examples"]) == (0.5, 2)
    # a run that trains on a registered dataset's transcripts keeps it from being deleted
    path = descriptor(workspace, **{"config.rlHyperparams.sftMix": {"data": "arith/demos", **mix},
                                    "config.rlHyperparams.maxSteps": 1})
    code, out, err = run(capsys, "runs", "start", "-f", path, "-o", "json")
    assert code == 0, err
    code, _, err = run(capsys, "registry", "datasets", "delete", "arith/demos")
    assert code == 1 and f"in use by run {json.loads(out)['runId']}" in err, err
    run(capsys, "runs", "wait", json.loads(out)["runId"], "--timeout", "300")
