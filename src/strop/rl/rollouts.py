"""The one rollout path: play episodes in lockstep, price each sampled token's drift from the base model, turn
rollouts into datums, and stop a step whose rollouts mostly failed. GRPO on datasets, GRPO in environments and
the evaluation of environments all go through here (the episodes: `strop.rl.episodes`; the types:
`strop.rl.types`).

    groups = play(sampler, renderer, source.episodes(rows, group_size=8), max_tokens=256, seed=0)
    datums = rollout_datums(groups[0], advantages_G)

Each turn, every episode still going renders its conversation and the replies are sampled as one batch.
Episodes of the same group that read the same prompt (every group's first turn, and all of a dataset's) are
one request of several samples, so the engine shares their prompt.
"""

from __future__ import annotations

import torch

from strop import types
from strop.errors import StropError
from strop.renderers import get_text_content
from strop.rl.types import Rollout, RolloutGroup, Turn

TURN_SEED = 1_000_033   # seeds of later turns step past every group's first-turn seed
MEMBER_SEED = 7_919     # and of episodes that left their group's shared prompt


def play(sampler, renderer, groups: list[list], *, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
         seed: int = 0, max_turns: int | None = None) -> list[RolloutGroup]:
    """Run each group's episodes (`strop.rl.episodes`) to their end or their turn limit (`max_turns` caps it
    for all); the groups' rollouts, in order. The request of group g's first turn is seeded `seed + g`."""
    live = [(g, k, episode) for g, group in enumerate(groups) for k, episode in enumerate(group)]
    messages = [episode.start() for _, _, episode in live]
    turns: list[list[Turn]] = [[] for _ in live]
    over = [False] * len(live)
    limits = [min(e.max_turns, max_turns) if max_turns else e.max_turns for _, _, e in live]
    for turn in range(max(limits, default=0)):
        requests: dict[tuple, list[int]] = {}
        prompts = {}
        for i, (g, _, episode) in enumerate(live):
            if over[i] or turn >= limits[i]:
                continue
            prompts[i] = episode.prompt(renderer, messages[i])
            requests.setdefault((g, tuple(prompts[i].to_ints())), []).append(i)
        if not requests:
            break
        futures = []
        for (g, _), members in requests.items():
            episode = live[members[0]][2]
            params = types.SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                          stop=episode.stop_sequences(renderer),
                                          seed=seed + g + TURN_SEED * turn + MEMBER_SEED * live[members[0]][1])
            futures.append((members, sampler.sample(prompt=prompts[members[0]], num_samples=len(members),
                                                    sampling_params=params)))
        for members, future in futures:
            for i, seq in zip(members, future.result().sequences):
                message, _ = renderer.parse_response(seq.tokens)
                text = get_text_content(message)
                turns[i].append(Turn(prompt=prompts[i], tokens=tuple(seq.tokens), logprobs=tuple(seq.logprobs),
                                     text=text, stop_reason=seq.stop_reason))
                messages[i].append({"role": "assistant", "content": text})
                observation = live[i][2].act(text)
                if observation is None:
                    over[i] = True
                else:
                    messages[i].append({"role": "tool", "content": observation})
    rollouts = [episode.finish(turns[i], messages[i]) for i, (_, _, episode) in enumerate(live)]
    out, at = [], 0
    for group in groups:
        out.append(tuple(rollouts[at:at + len(group)]))
        at += len(group)
    return out


def turn_kl(base_sampler, rollouts) -> list[list[list[float]]]:
    """Per rollout, per turn, per sampled token: log p_sampler - log p_base (the model with the adapter off),
    scored over each turn's own prompt, which holds the observations so far. All turns in one batched pass."""
    turns = [t for r in rollouts for t in r.turns if t.tokens]
    base_lps = base_sampler.compute_logprobs_many(
        [t.prompt.append(types.EncodedTextChunk(tokens=list(t.tokens))) for t in turns]).result() if turns else []
    by_turn = iter([[lp - b for lp, b in zip(t.logprobs, base[t.prompt.length:])] for t, base in zip(turns, base_lps)])
    return [[next(by_turn) if t.tokens else [] for t in r.turns] for r in rollouts]


def rollout_datums(rollouts, advantages_G: torch.Tensor, kl_G: list[list[list[float]]] | None = None,
                   kl_beta: float = 0.0) -> list[types.Datum]:
    """One datum per turn in the seed's layout: input = prompt + sampled[:-1], targets shifted by one, the prompt
    masked (advantage 0) and each sampled token carrying its rollout's advantage, less beta x its KL to the base
    model when `kl_G` is given. A turn that sampled nothing trains nothing."""
    datums = []
    for g, (rollout, advantage) in enumerate(zip(rollouts, advantages_G.tolist())):
        for i, turn in enumerate(rollout.turns):
            if not turn.tokens:
                continue
            ob_len = turn.prompt.length - 1
            toks = list(turn.tokens)
            adv_T = [advantage] * len(toks)
            if kl_G is not None:
                adv_T = [a - kl_beta * k for a, k in zip(adv_T, kl_G[g][i])]
            datums.append(types.Datum(
                model_input=turn.prompt.append(types.EncodedTextChunk(tokens=toks[:-1])),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_torch(torch.tensor([0] * ob_len + toks)),
                    "logprobs": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + list(turn.logprobs))),
                    "advantages": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + adv_T)),
                }))
    return datums


def check_errors(rollouts: list[Rollout], limit: float, step: int, failure: str = "grader calls failed") -> None:
    """Fail the step, before its update, when more than `limit` of its checks (grader calls, environment
    episodes) failed: their rewards say nothing about the policy. Shows the first distinct errors."""
    checks = sum(r.checks for r in rollouts)
    failed = sum(r.failed for r in rollouts)
    if checks and failed / checks > limit:
        errors = [e for r in rollouts for e in r.errors]
        first = "\n  ".join(list(dict.fromkeys(errors))[:3])  # distinct, in the order they happened
        raise StropError(f"step {step}: {failed} of {checks} {failure}, more than the {limit:.0%} allowed "
                         f"(max_reward_error_fraction / config.reward.maxErrorFraction); first errors:\n  {first}")
