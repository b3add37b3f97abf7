"""klReference: the KL penalty measures drift from the model the run started from ("start", the default) or from
the base model with the adapter off ("base"). At step 0 of a run from an adapter the policy is that adapter, so
its KL to "start" is 0 and to "base" is not."""

import pytest
import torch
from safetensors.torch import load_file, save_file

import strop
from strop.rl import GRPOConfig, run_grpo


def changed_adapter(model_dir, folder):
    """A LoRA adapter whose B matrices are not zero, so it differs from the base model."""
    training = strop.ServiceClient().create_lora_training_client(base_model=str(model_dir), rank=4, seed=0)
    path = training.save_weights(str(folder)).result().path
    weights = f"{path}/adapter_model.safetensors"
    tensors = load_file(weights)
    generator = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=generator) * 0.5 if "lora_B" in k else v
               for k, v in tensors.items()}, weights)
    return path


@pytest.mark.parametrize("reference", ["start", "base"])
def test_kl_at_step_zero_of_a_run_from_an_adapter(tiny_model_dir, tmp_path, reference):
    bundle = tmp_path / "lengthy"
    bundle.mkdir()
    (bundle / "reward.py").write_text("def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                      "extra_info=None):\n    return (len(solution_str) % 7) / 7.0\n")
    adapter = changed_adapter(tiny_model_dir, tmp_path / "start")
    config = GRPOConfig(base_model=str(tiny_model_dir), dataset="synthetic:add", init_adapter=adapter, kl_beta=0.1,
                        kl_reference=reference, group_size=4, batch_size=2, max_steps=1, max_completion_length=8,
                        sandbox_graders=False, reward_terms=[{"name": "length", "weight": 1.0, "grader": str(bundle)}])
    [row] = run_grpo(config, tmp_path / "run", progress=False).metrics
    assert row["datums"] > 0
    if reference == "start":
        assert row["klBase"] == pytest.approx(0.0, abs=1e-4)   # the policy is still the adapter it started from
    else:
        assert abs(row["klBase"]) > 1e-2, row["klBase"]        # the base never learnt what the adapter holds
