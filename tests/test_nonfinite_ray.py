"""A non-finite loss on data-parallel trainers (a real two-node Ray cluster on loopback): every replica skips the
update, not only the one whose share held the NaN, so the replicas stay the same and finite."""

from __future__ import annotations

import pytest
import torch

from strop import types
from strop.cluster import RaySettings

from test_ray import _is_datums, cluster  # noqa: F401 - the two-node cluster of the Ray tests

ray = pytest.importorskip("ray", reason="the dev install has ray: pip install -e \".[dev]\"")


def test_data_parallel_replicas_all_skip_an_update_one_of_them_found_non_finite(cluster, tiny_model_dir):  # noqa: F811
    from strop.cluster.trainer import RemoteTrainer

    two = RemoteTrainer("strop/tiny-random", tiny_model_dir, settings=RaySettings(address=cluster.address, trainers=2),
                        dtype="float32", rank=4, seed=3)
    try:
        adam = types.AdamParams(learning_rate=1e-2)
        two.forward_backward(_is_datums(4, seed=1), "importance_sampling")
        two.optim_step(adam)  # a first update, so lora_B is no longer all zeros
        before = two.replica_weights()
        batch = _is_datums(4, seed=2)
        advantages = batch[0].loss_fn_inputs["advantages"].to_torch().clone()
        advantages[-1] = float("nan")  # in one datum: one replica's share
        batch[0] = types.Datum(model_input=batch[0].model_input, loss_fn_inputs={
            **batch[0].loss_fn_inputs, "advantages": types.TensorData.from_torch(advantages)})
        assert two.forward_backward(batch, "importance_sampling").metrics["nonfinite_loss:sum"] == 1.0
        assert two.optim_step(adam)["skipped_nonfinite"] == 1.0
        after = two.replica_weights()
        for old, new in zip(before, after):
            assert all(torch.equal(old[k], new[k]) for k in old)  # neither replica moved
        assert all(torch.isfinite(t).all() for t in after[0].values())
    finally:
        two.close()
