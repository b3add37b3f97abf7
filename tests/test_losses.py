"""Advantages and losses against values worked out by hand (the numbers in comments are the working)."""

import math

import pytest
import torch

from strop.engine import losses
from strop.rl import advantages


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_group_advantages_centre_without_scaling():
    adv = advantages.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]  # mean 0.5


def test_group_advantages_scaled_by_population_std():
    adv = advantages.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), scale_by_std=True, eps=0.0)
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0]  # std of {1,0,0,1} is 0.5
    adv = advantages.group_advantages(torch.tensor([3.0, 1.0]), scale_by_std=True, eps=0.0)
    assert adv.tolist() == [1.0, -1.0]  # mean 2, std 1


def test_zero_variance_groups():
    assert advantages.is_zero_variance(torch.tensor([0.1, 0.1, 0.1]))
    assert not advantages.is_zero_variance(torch.tensor([0.1, 1.1, 0.1]))
    assert advantages.group_advantages(torch.tensor([0.7, 0.7])).tolist() == [0.0, 0.0]


def test_cross_entropy_value_and_gradient():
    lp = leaf([math.log(0.5), math.log(0.25)])
    loss = losses.cross_entropy_loss(lp, torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert loss.item() == pytest.approx(math.log(2))  # -(log 0.5) ; the second token has weight 0
    loss.backward()
    assert lp.grad.tolist() == [-1.0, 0.0]


def test_importance_sampling_value_and_gradient():
    # p = (0.5, 0.25), q = (0.25, 0.25): ratios (2, 1); advantages (1, -2)
    lp = leaf([math.log(0.5), math.log(0.25)])
    old = torch.tensor([math.log(0.25), math.log(0.25)], dtype=torch.float64)
    loss = losses.importance_sampling_loss(lp, old, torch.tensor([1.0, -2.0], dtype=torch.float64))
    assert loss.item() == pytest.approx(0.0)  # -(2*1 + 1*(-2))
    loss.backward()
    # d/dlp of -exp(lp - old) * A = -ratio * A
    assert lp.grad.tolist() == pytest.approx([-2.0, 2.0])


def test_importance_sampling_on_policy_is_plain_policy_gradient():
    lp = leaf([-1.0, -2.0, -0.5])
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    losses.importance_sampling_loss(lp, lp.detach(), adv).backward()
    assert lp.grad.tolist() == pytest.approx([-0.5, 1.0, -2.0])  # ratio 1 everywhere: grad = -A


def test_ppo_clips_only_where_the_clip_binds():
    # ratios (2, 1, 0.5, 0.5) with advantages (1, -2, -1, 1), clip [0.8, 1.2]
    #  t0: min(2*1, 1.2*1) = 1.2 (clipped: no gradient)
    #  t1: ratio 1 inside the range: -2, gradient -r*A = 2
    #  t2: min(0.5*-1, 0.8*-1) = -0.8 (clipped: no gradient)
    #  t3: min(0.5*1, 0.8*1) = 0.5 (unclipped: gradient -0.5)
    q = math.log(0.2)
    lp = leaf([math.log(0.4), q, math.log(0.1), math.log(0.1)])
    old = torch.full((4,), q, dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, -1.0, 1.0], dtype=torch.float64)
    loss, clipped = losses.ppo_loss(lp, old, adv, 0.8, 1.2)
    assert loss.item() == pytest.approx(-(1.2 - 2.0 - 0.8 + 0.5))
    assert clipped.tolist() == [True, False, True, False]
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, 2.0, 0.0, -0.5])


def test_cispo_keeps_gradient_through_clipped_weights():
    # ratios (2, 1): weights clip to (1.2, 1.0) and are constants; grad = -w * A
    lp = leaf([math.log(0.5), math.log(0.25)])
    old = torch.tensor([math.log(0.25), math.log(0.25)], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss = losses.cispo_loss(lp, old, adv, 0.8, 1.2)
    assert loss.item() == pytest.approx(-(1.2 * 1 * math.log(0.5) + 1.0 * -2 * math.log(0.25)))
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-1.2, 2.0])


def test_dro_is_reinforce_with_a_quadratic_pull_towards_the_sampler():
    # grad of -(A * lp - beta/2 * (lp - old)^2) in lp = -A + beta * (lp - old)
    lp = leaf([math.log(0.5), math.log(0.25)])
    old = torch.tensor([math.log(0.25), math.log(0.25)], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss = losses.dro_loss(lp, old, adv, beta=0.5)
    gap = math.log(0.5) - math.log(0.25)
    assert loss.item() == pytest.approx(-(math.log(0.5) - 0.25 * gap ** 2 - 2 * math.log(0.25)))
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-1.0 + 0.5 * gap, 2.0])
    same, _ = losses.sequence_loss("dro", leaf([-1.0]), {"logprobs": torch.tensor([-1.0], dtype=torch.float64),
                                                         "advantages": torch.tensor([3.0], dtype=torch.float64)})
    assert same.item() == pytest.approx(3.0)   # on-policy the penalty is 0: -A * log p


def test_kl_estimates():
    old = torch.tensor([-1.0, -2.0])
    lp = torch.tensor([-1.5, -1.0])
    assert losses.kl_sample_train(old, lp).item() == pytest.approx(((-1 + 1.5) + (-2 + 1)) / 2)
    assert advantages.kl_penalty(lp, torch.tensor([-1.0, -1.0])).tolist() == [-0.5, 0.0]


@pytest.mark.parametrize("keep", [False, True], ids=["recomputed", "kept"])
def test_the_fused_vocabulary_head_gives_log_softmax_its_entropy_and_its_gradient(keep):
    from strop.engine.trainer import _TargetLogprob
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(300, 12, dtype=torch.float64, generator=gen) * 3  # peaked distributions too
    targets = torch.randint(0, 300, (40,), generator=gen)
    lp, entropy = _TargetLogprob.apply(hidden, weight, targets, keep)
    ref = torch.log_softmax(hidden @ weight.t(), -1)
    assert torch.allclose(lp, ref.gather(-1, targets[:, None])[:, 0])
    assert torch.allclose(entropy, -(ref.exp() * ref).sum(-1)) and not entropy.requires_grad
    upstream = torch.randn(40, dtype=torch.float64, generator=gen)
    (grad,) = torch.autograd.grad(lp, hidden, upstream)
    leaf = hidden.detach().requires_grad_()
    (expected,) = torch.autograd.grad(torch.log_softmax(leaf @ weight.t(), -1).gather(-1, targets[:, None])[:, 0],
                                      leaf, upstream)
    assert torch.allclose(grad, expected)
    if not keep:  # gradcheck runs one graph's backward many times; a kept softmax is used up by its first
        assert torch.autograd.gradcheck(lambda h: _TargetLogprob.apply(h, weight, targets, False)[0], (hidden,))


def test_the_head_keeps_softmax_within_its_budget_and_recomputes_past_it(monkeypatch):
    from strop.engine import trainer
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(12, 300, bias=False).double().requires_grad_(False)
    hidden = torch.randn(50, 12, dtype=torch.float64, generator=gen)
    targets = torch.randint(0, 300, (50,), generator=gen)
    monkeypatch.setattr(trainer, "HEAD_CHUNK", 16)  # 4 chunks: 16, 16, 16, 2 positions
    kept = []
    apply = trainer._TargetLogprob.apply
    monkeypatch.setattr(trainer._TargetLogprob, "apply", lambda h, w, t, keep: kept.append(keep) or apply(h, w, t, keep))
    grads = []
    for budget in (0, 2 * 16 * 300 * 4, 1 << 30):  # none, the first two chunks, all
        monkeypatch.setattr(trainer, "HEAD_KEEP_BYTES", budget)
        leaf = hidden.clone().requires_grad_()
        lp, _ = trainer._head_logprobs(head, leaf, targets)
        lp.sum().backward()
        grads.append(leaf.grad)
    assert kept == [False] * 4 + [True, True, False, False] + [True] * 4
    assert torch.allclose(grads[0], grads[1]) and torch.allclose(grads[0], grads[2])
    with torch.no_grad():  # nothing is kept without gradients
        kept.clear()
        trainer._head_logprobs(head, hidden, targets)
    assert kept == [False] * 4


def test_every_list_of_loss_names_is_the_engines_registry():
    import typing

    from strop import types
    from strop.cli.main import build_parser
    from strop.engine.trainer import REQUIRED_INPUTS
    from strop.rl.config import LOSS_FNS
    assert typing.get_args(types.LossFnType) == tuple(losses.LOSSES)
    assert {k: v for k, v in REQUIRED_INPUTS.items()} == {k: v.inputs for k, v in losses.LOSSES.items()}
    assert LOSS_FNS == losses.POLICY_LOSSES == ("importance_sampling", "ppo", "cispo", "dro")
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    [loss_flag] = [a for a in train._actions if "--loss" in a.option_strings]
    assert tuple(loss_flag.choices) == losses.POLICY_LOSSES


def test_sequence_loss_dispatches_by_name():
    lp = leaf([-1.0, -2.0])
    inputs = {"logprobs": torch.tensor([-1.0, -1.0], dtype=torch.float64),
              "advantages": torch.tensor([1.0, 1.0], dtype=torch.float64),
              "weights": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    for name in losses.LOSSES:
        loss, clipped = losses.sequence_loss(name, lp, inputs)
        assert (clipped is not None) == (name in ("ppo", "cispo"))   # cispo: the positions whose weight was clipped
    assert losses.sequence_loss("cross_entropy", lp, inputs)[0].item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="unknown loss"):
        losses.sequence_loss("gspo", lp, inputs)
