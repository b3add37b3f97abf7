"""The one rollout path: play episodes in lockstep, price each sampled token's drift from the base model, turn
rollouts into datums, and stop a step whose rollouts mostly failed. GRPO on datasets, GRPO in environments and
the evaluation of environments all go through here (the episodes: `strop.rl.episodes`; the types:
`strop.rl.types`).

    groups = play(sampler, renderer, source.episodes(rows, group_size=8), max_tokens=256, seed=0)
    datums = rollout_datums(groups[0], advantages_G)

Each turn, every episode still going renders its conversation and the replies are sampled as one batch.
Episodes of the same group that read the same prompt (every group's first turn, and all of a dataset's) are
one request of several samples, so the engine shares their prompt. Then every episode acts on its reply: in
turn, or all at once when the episodes are `concurrent` (their environments or graders live in other processes:
sandboxed graders, `strop.cluster.envs`, `strop.cluster.graders`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from strop import types
from strop.errors import StropError
from strop.renderers import get_text_content
from strop.rl.types import Rollout, RolloutGroup, Turn

TURN_SEED = 1_000_033   # seeds of later turns step past every group's first-turn seed
MEMBER_SEED = 7_919     # and of episodes that left their group's shared prompt
MAX_CONCURRENT_CALLS = 64  # environment calls in flight at once, when the environments say they may be


def play(sampler, renderer, groups: list[list], *, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
         seed: int = 0, max_turns: int | None = None, on_turn=None, started: list[list] | None = None
         ) -> list[RolloutGroup]:
    """Run each group's episodes (`strop.rl.episodes`) to their end or their turn limit (`max_turns` caps it
    for all); the groups' rollouts, in order. The request of group g's first turn is seeded `seed + g`.
    `on_turn(finished, total)`, when given, is called after every turn with the number of episodes over.
    `started`, per group per episode, (messages, turns) of episodes already started and played that far (a
    branched group's members, `strop.rl.branching`): each goes on from its next turn."""
    live = [(g, k, episode) for g, group in enumerate(groups) for k, episode in enumerate(group)]
    if started is None:
        messages, turns = start_episodes(live), [[] for _ in live]
    else:
        flat = [state for group in started for state in group]
        messages, turns = [list(m) for m, _ in flat], [list(t) for _, t in flat]
    play_turns(sampler, renderer, live, messages, turns, max_tokens=max_tokens, temperature=temperature,
               top_p=top_p, seed=seed, max_turns=max_turns, on_turn=on_turn)
    rollouts = each_episode(live)(lambda i: live[i][2].finish(turns[i], messages[i]), range(len(live)))
    out, at = [], 0
    for group in groups:
        out.append(tuple(rollouts[at:at + len(group)]))
        at += len(group)
    return out


def start_episodes(live: list) -> list[list[dict]]:
    """Each episode's first messages (`live`: (group, member, episode) triples)."""
    return each_episode(live)(lambda item: item[2].start(), live)


def play_turns(sampler, renderer, live: list, messages: list[list[dict]], turns: list[list[Turn]], *,
               max_tokens: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
               max_turns: int | None = None, on_turn=None) -> list[bool]:
    """Play the `live` episodes ((group, member, episode) triples) on from their `turns` so far, appending to
    `messages` and `turns` in place; per episode, whether it ended (rather than reaching its turn limit)."""
    each = each_episode(live)
    over = [False] * len(live)
    limits = [min(e.max_turns, max_turns) if max_turns else e.max_turns for _, _, e in live]
    for turn in range(max(limits, default=0)):
        requests: dict[tuple, list[int]] = {}
        prompts = {}
        for i, (g, _, episode) in enumerate(live):
            if over[i] or turn >= limits[i] or turn < len(turns[i]):
                continue
            prompts[i] = episode.prompt(renderer, messages[i])
            requests.setdefault((g, tuple(prompts[i].to_ints())), []).append(i)
        if not requests and turn >= max((len(t) for t in turns), default=0):
            break
        futures = []
        for (g, _), members in requests.items():
            episode = live[members[0]][2]
            params = types.SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                          stop=episode.stop_sequences(renderer),
                                          seed=seed + g + TURN_SEED * turn + MEMBER_SEED * live[members[0]][1])
            futures.append((members, sampler.sample(prompt=prompts[members[0]], num_samples=len(members),
                                                    sampling_params=params)))
        replies = []
        for members, future in futures:
            for i, seq in zip(members, future.result().sequences):
                message, _ = renderer.parse_response(seq.tokens)
                text = get_text_content(message)
                turns[i].append(Turn(prompt=prompts[i], tokens=tuple(seq.tokens), logprobs=tuple(seq.logprobs),
                                     text=text, stop_reason=seq.stop_reason))
                messages[i].append({"role": "assistant", "content": text})
                replies.append((i, text))
        observations = each(lambda reply: live[reply[0]][2].act(reply[1]), replies)
        for (i, _), observation in zip(replies, observations):
            if observation is None:
                over[i] = True
            else:
                messages[i].append({"role": "tool", "content": observation})
        if on_turn is not None and requests:
            on_turn(sum(over[i] or turn + 1 >= limits[i] for i in range(len(live))), len(live))
    return over


def each_episode(live: list):
    """How to call the episodes: at once when any is `concurrent` (its environment or graders in another process)."""
    return _concurrently if any(getattr(e, "concurrent", False) for _, _, e in live) else _in_turn


def _in_turn(fn, items) -> list:
    return [fn(item) for item in items]


def _concurrently(fn, items) -> list:
    """`fn` of each item, at once: environments and graders in other processes wait in parallel."""
    items = list(items)
    if len(items) < 2:
        return _in_turn(fn, items)
    with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT_CALLS, len(items))) as pool:
        return list(pool.map(fn, items))


def turn_kl(base_sampler, rollouts, untrained_G: list[int] | None = None) -> list[list[list[float]]]:
    """Per rollout, per turn, per sampled token: log p_sampler - log p_base (`base_sampler`: the KL reference,
    the model the run started from or the base, `strop.rl.reference`),
    scored over each turn's own prompt, which holds the observations so far. All turns in one batched pass. The
    first `untrained_G[g]` turns of rollout g are not trained (`strop.rl.branching`): they get [] and no pass.

    A rollout's turns are scored as one sequence while each turn's prompt begins with the tokens before it (as
    `rollout_datums` chains them): a turn's logprobs depend only on the tokens before it, so the values are the
    same, and the conversation is not run again for every turn (finance-sql-shaped rollouts after the branch:
    0.36x the tokens and the time, `benchmarks/kl_scoring.py`)."""
    skip = untrained_G or [0] * len(rollouts)
    wanted = [[bool(t.tokens) and i >= skip[g] for i, t in enumerate(r.turns)] for g, r in enumerate(rollouts)]
    sequences: list[list[int]] = []
    places = []  # per wanted turn: (its sequence, where its tokens start there)
    for rollout, w in zip(rollouts, wanted):
        chained: list[int] | None = None
        for turn, ok in zip(rollout.turns, w):
            if not ok:
                continue
            prompt = turn.prompt.to_ints()
            if chained is None or prompt[:len(chained)] != chained:
                chained = []
                sequences.append(chained)
            chained += prompt[len(chained):]
            places.append((len(sequences) - 1, len(chained), turn))
            chained += turn.tokens
    base_lps = base_sampler.compute_logprobs_many(
        [types.ModelInput.from_ints(s) for s in sequences]).result() if sequences else []
    by_turn = iter([[lp - b for lp, b in zip(turn.logprobs, base_lps[s][start:start + len(turn.tokens)])]
                    for s, start, turn in places])
    return [[next(by_turn) if ok else [] for ok in w] for w in wanted]


def rollout_datums(rollouts, advantages_G: torch.Tensor, kl_G: list[list[list[float]]] | None = None,
                   kl_beta: float = 0.0, untrained_G: list[int] | None = None) -> list[types.Datum]:
    """The datums of a group's rollouts in the seed's layout: input = tokens[:-1], targets shifted by one, each
    sampled token carrying its rollout's advantage (less beta x its KL to the base model when `kl_G` is given)
    and every other position masked (target 0, advantage 0). A turn that sampled nothing trains nothing, nor do
    the first `untrained_G[g]` turns of rollout g (a branched group's shared prefix, turns the whole group wrote
    alike: `strop.rl.branching`; default: each rollout's `shared_turns`): they are masked as the prompt is, so
    a group's rows begin with the same untrained tokens and the trainer runs them once (`shared_prefixes`).

    The turns of one rollout share a datum while each turn's prompt begins with the previous turn's prompt and
    sampled tokens (the conversation re-rendered to the same tokens, as it does for a chat template): a datum
    per turn would pay the forward and backward pass over the whole conversation again for every turn, ~4x the
    tokens of a 5-turn episode. Where re-rendering changed a token, the turn starts a datum of its own. The
    losses are sums over positions, so the update is the same either way."""
    datums = []
    skip = untrained_G if untrained_G is not None else [r.shared_turns for r in rollouts]
    for g, (rollout, advantage) in enumerate(zip(rollouts, advantages_G.tolist())):
        sequence: list[int] = []  # the tokens so far of the datum being built
        targets: list[int] = []   # per position of `sequence` (the token it predicts; one shorter)
        logprobs: list[float] = []
        advantages: list[float] = []
        for i, turn in enumerate(rollout.turns):
            if not turn.tokens or i < skip[g]:
                continue  # an untrained turn's tokens join the datum with the next turn's prompt, masked
            prompt = turn.prompt.to_ints()
            toks = list(turn.tokens)
            adv_T = [advantage] * len(toks)
            if kl_G is not None:
                adv_T = [a - kl_beta * k for a, k in zip(adv_T, kl_G[g][i])]
            if not sequence or prompt[:len(sequence)] != sequence:
                if sequence:
                    datums.append(_datum(sequence, targets, logprobs, advantages))
                sequence, targets, logprobs, advantages = prompt[:1], [], [], []
            observed = len(prompt) - len(sequence)  # the prompt's tokens this datum does not hold yet: masked
            sequence += prompt[len(sequence):] + toks
            targets += [0] * observed + toks
            logprobs += [0.0] * observed + list(turn.logprobs)
            advantages += [0.0] * observed + adv_T
        if sequence:
            datums.append(_datum(sequence, targets, logprobs, advantages))
    return datums


def _datum(sequence: list[int], targets: list[int], logprobs: list[float], advantages: list[float]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(sequence[:-1]), loss_fn_inputs={
        "target_tokens": types.TensorData.from_torch(torch.tensor(targets)),
        "logprobs": types.TensorData.from_torch(torch.tensor(logprobs)),
        "advantages": types.TensorData.from_torch(torch.tensor(advantages))})


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
