"""Training clients on one base model share its frozen weights (loaded once), each with its own adapter."""

from __future__ import annotations

import torch

import strop
from strop import types


def _datum(tokens):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


def _weight(client, suffix="q_proj.base_layer.weight"):
    return next(p for n, p in client.trainer.model.named_parameters() if n.endswith(suffix))


def test_two_training_clients_hold_one_copy_of_the_base_and_train_apart(tiny_model_dir):
    service = strop.ServiceClient(dtype="float32")
    a = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=1)
    b = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=2)
    assert _weight(a).data_ptr() == _weight(b).data_ptr()          # the same tensor, not a copy
    embed = [p for n, p in a.trainer.model.named_parameters() if "embed_tokens" in n][0]
    assert embed.data_ptr() == [p for n, p in b.trainer.model.named_parameters() if "embed_tokens" in n][0].data_ptr()
    datum = _datum([3, 1, 4, 1, 5, 9, 2, 6])
    b_before = b.forward([datum]).result().loss_fn_outputs[0]["logprobs"].tolist()
    base_before = _weight(a).detach().clone()
    for _ in range(5):
        a.forward_backward([datum]).result()
        a.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    a_after = a.forward([datum]).result().loss_fn_outputs[0]["logprobs"].tolist()
    assert sum(a_after) > sum(b_before) + 1.0                       # a learned
    assert b.forward([datum]).result().loss_fn_outputs[0]["logprobs"].tolist() == b_before   # b did not move
    assert torch.equal(_weight(a), base_before)                     # and the shared base stayed frozen
    # a's adapter, saved and loaded into a fresh client, gives a's outputs: nothing of it lives in the base
    path = a.save_weights(name=str(tiny_model_dir.parent / "shared-a")).result().path
    c = service.create_training_client_from_adapter(str(tiny_model_dir), path)
    assert c.forward([datum]).result().loss_fn_outputs[0]["logprobs"].tolist() == a_after
