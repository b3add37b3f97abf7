"""Turn-level credit: groups that branch from one shared state, and turns a whole group wrote alike.

    groups = play_branched(sampler, renderer, lambda n: source.episodes(tasks, n), group_size=8, branch_at=3,
                           max_tokens=256, seed=0)
    untrained = untrained_turns(group, skip_identical=True)    # per rollout: leading turns the update leaves out

Branching (`branch_at_turn` N): each task's episode is played once, by a scout, up to turn N; then `group_size`
episodes are put in exactly the state the scout reached and sampled on from there. They differ from turn N on,
so the group's mean reward is a baseline for the decision at turn N rather than for the whole episode. The scout
samples the prefix once; at turn N every member reads the same prompt, so the G continuations are one request
of G samples whose prompt the engine shares. Each member's rollout starts with the scout's turns (the same
`Turn`s, token for token) and `shared_turns` counts them: they carry no advantage and are masked in the datums
as the prompt is, so the trainer runs them once for the group (`strop.engine.trainer.shared_prefixes`). N = 1
is an ordinary group. Only an environment's episodes branch; a dataset's have one turn.

The state is rebuilt by replay, which any environment with `reset` and `step` allows (a remote one too, which
cannot be copied): each member's environment is reset to the task and the scout's replies are acted on again,
in order. The environment must be deterministic: the same task and the same calls give the same observations
(no clock, no randomness of its own). Every replayed observation is compared with the scout's, and one that
differs stops the step, saying which.

The scout samples at the run's temperature, or at `scout_temperature` when that is set (0: greedy, so the group
branches from the state the model's own greedy evaluation would reach rather than from a sampled one that may
have gone astray before the decision being trained).

With `scout` "reference" the turns before the branch are not sampled: they are the environment's
`reference_calls(task)` (the calls a known-good agent makes, e.g. finance-sql's scripted agent), each written as
the model writes a call. Every group then branches from the state a good agent reaches, so the decision at turn
N is trained where it should be made, not after a sampled mistake that no continuation can repair (the start
states come from a demonstration, as in Salimans and Chen's "Learning Montezuma's Revenge from a Single
Demonstration", 2018). A pool chosen by probing that state (a benchmark's) is then trained from that state too.

A scout that ends before turn N (it answered at turn k < N, or its turn limit is below N) branches the group
at the last turn it reached, k: turns 1 .. k-1 are shared and turn k is sampled G times (k = 1: an ordinary
group). The scout itself is not trained.

Identical turns (`identical_turns`): with whole-episode credit, a turn every member of a group wrote alike (the
same prompt, the same tokens) gets advantages that sum to zero over the group, so its gradient cancels: for a
loss whose per-token gradient is the advantage times a factor that is the same for the same token in the same
context (importance_sampling, with or without tis, and cispo) and no KL penalty, leaving it out of the update
changes nothing. Only a leading run of such turns is left out (a later one has the same context only if every
turn before it was alike).
"""

from __future__ import annotations

import dataclasses
import json

from strop.errors import StropError
from strop.rl.limits import LIMITS
from strop.renderers.tools import hermes_turn
from strop.rl.rollouts import each_episode, play, play_turns, start_episodes
from strop.rl.types import Turn
from strop.tool_calls import ToolCall
from strop.types import ModelInput

BRANCH_SEED = 500_009  # the members' sampling seeds step past the scouts' (a scout may have sampled turn k too)
RESERVED_SEED = 300_007  # a group's reserved members, sampled where it is not guided, step past its other members'
# losses whose gradient on a token is its advantage times a factor fixed by the token and its context: a turn
# the whole group wrote alike cancels out of them exactly (advantages within a group sum to zero)
CANCELLING_LOSSES = ("importance_sampling", "cispo")
IDENTICAL_TURNS = ("auto", "skip", "train")
SCOUTS = ("policy", "reference")  # who plays the turns before the branch: the model, or the environment's calls
REFERENCE_WHEN = ("always", "uninformative")  # the groups reference members play the reference in


def play_branched(sampler, renderer, episodes_of, *, group_size: int, branch_at: int, max_tokens: int,
                  temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, max_turns: int | None = None,
                  on_turn=None, scout_temperature: float | None = None, scout: str = "policy",
                  reference_members: int = 0, guide_where=None) -> list[tuple]:
    """The groups of a step's tasks, each branched at turn `branch_at` (1-based) from one scout's episode.
    `episodes_of(n)` makes n fresh episodes of every task, per task (a source's `episodes(tasks, n)`); the scouts
    are made first and are done with before the members reset the same environments. The scouts sample at
    `scout_temperature` (0: greedy) when it is given, else at `temperature`, as the members do; with `scout`
    "reference" they play the environment's reference calls instead. The last `reference_members` episodes of
    each group play the reference calls to the end (from the scout's state) instead of sampling; with
    `guide_where` (the groups of sampled rollouts -> per group, whether to guide it) only in the groups it names,
    and the other groups sample those episodes too."""
    if branch_at <= 1:
        groups = episodes_of(group_size)
        sampled = [group[:len(group) - reference_members] for group in groups]
        rolled = play(sampler, renderer, sampled, max_tokens=max_tokens, temperature=temperature,
                      top_p=top_p, seed=seed, max_turns=max_turns, on_turn=on_turn)
        if not reference_members:
            return rolled
        reserved = [(t, k, e) for t, group in enumerate(groups) for k, e in enumerate(group) if k >= len(sampled[t])]
        return _guided(sampler, renderer, rolled, reserved, None, guide_where, max_turns=max_turns,
                       max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    scouts = [(t, 0, group[0]) for t, group in enumerate(episodes_of(1))]
    messages = start_episodes(scouts)
    opening = [len(m) for m in messages]
    turns = [[] for _ in scouts]
    before = min(branch_at - 1, max_turns or branch_at)
    if scout == "reference":
        ended = [_play_reference(renderer, episode, messages[i], turns[i], before)
                 for i, (_, _, episode) in enumerate(scouts)]
    else:
        scout_t = temperature if scout_temperature is None else scout_temperature
        ended = play_turns(sampler, renderer, scouts, messages, turns, max_tokens=max_tokens, temperature=scout_t,
                           top_p=top_p if scout_t else 1.0, seed=seed, max_turns=before)
    prefixes = []
    for t, (_, _, scout) in enumerate(scouts):
        limit = min(scout.max_turns, max_turns) if max_turns else scout.max_turns
        reached = len(turns[t])
        at = reached + 1 if not ended[t] and reached < limit else reached  # the turn the members sample first
        shared = max(0, at - 1)
        observations = [m["content"] for m in messages[t][opening[t] + 1:opening[t] + 2 * shared:2]]
        prefixes.append((messages[t][:opening[t]], turns[t][:shared], observations))
    groups = episodes_of(group_size)
    members = [(t, k, episode) for t, group in enumerate(groups) for k, episode in enumerate(group)]
    starts = start_episodes(members)
    replayed = _replay(members, starts, prefixes)
    sampled = [group[:len(group) - reference_members] for group in groups]
    at = [0]
    for group in groups:
        at.append(at[-1] + len(group))
    rolled = play(sampler, renderer, sampled, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                  seed=seed + BRANCH_SEED, max_turns=max_turns, on_turn=on_turn,
                  started=[[replayed[at[t] + k] for k in range(len(group))] for t, group in enumerate(sampled)])
    if reference_members:
        reserved = [i for i, (t, k, _) in enumerate(members) if k >= len(sampled[t])]
        rolled = _guided(sampler, renderer, rolled, [members[i] for i in reserved], [replayed[i] for i in reserved],
                         guide_where, max_turns=max_turns, max_tokens=max_tokens, temperature=temperature,
                         top_p=top_p, seed=seed + BRANCH_SEED)
    return [tuple(dataclasses.replace(r, shared_turns=len(prefixes[t][1])) for r in group)
            for t, group in enumerate(rolled)]


def reference_rollouts(sampler, renderer, live: list, started: list, max_turns: int | None = None) -> list:
    """Episodes (`live`: (group, member, episode) triples, each already `started` as (messages, turns)) played
    on to their end by the environment's reference calls rather than sampled: the off-policy guides of a group
    (`reference_members`). Each reference turn is priced under `sampler`'s weights, the weights the step's own
    episodes were sampled under, so it enters the loss as a sampled turn does."""
    messages = [list(m) for m, _ in started]
    turns = [list(t) for _, t in started]

    def play_on(i: int) -> None:
        episode = live[i][2]
        limit = min(episode.max_turns, max_turns) if max_turns else episode.max_turns
        _play_reference(renderer, episode, messages[i], turns[i], limit, skip=len(turns[i]),
                        who="referenceMembers (rlHyperparams.referenceMembers)")
    each_episode(live)(play_on, range(len(live)))
    fresh = [(i, j) for i in range(len(live)) for j in range(len(started[i][1]), len(turns[i]))]
    if fresh:
        whole = [ModelInput.from_ints(turns[i][j].prompt.to_ints() + list(turns[i][j].tokens)) for i, j in fresh]
        priced = sampler.compute_logprobs_many(whole).result()
        for (i, j), logprobs in zip(fresh, priced):
            turn = turns[i][j]
            turns[i][j] = dataclasses.replace(turn, logprobs=tuple(float(x) for x in logprobs[turn.prompt.length:]))
    finished = each_episode(live)(lambda i: live[i][2].finish(turns[i], messages[i]), range(len(live)))
    return [dataclasses.replace(r, reference=True) for r in finished]


def _guided(sampler, renderer, rolled: list, reserved: list, started: list | None, guide_where, *,
            max_turns: int | None, seed: int, **sampling) -> list[tuple]:
    """Each group's sampled rollouts (`rolled`) followed by its reserved episodes (`reserved`: (group, member,
    episode) triples, `started` as (messages, turns), or None: from the start), played on by the reference calls
    in the groups `guide_where(rolled)` names (all when it is None) and sampled in the others, seeded past the
    group's other members (`RESERVED_SEED`)."""
    guide = [True] * len(rolled) if guide_where is None else list(guide_where(rolled))
    started = started or [(m, []) for m in start_episodes(reserved)]
    guides = [i for i, (t, _, _) in enumerate(reserved) if guide[t]]
    rest = [i for i, (t, _, _) in enumerate(reserved) if not guide[t]]
    played = reference_rollouts(sampler, renderer, [reserved[i] for i in guides], [started[i] for i in guides],
                                max_turns)
    order = list(guides)
    if rest:
        # groups keep their index, so each group's sampling seed is its own; a guided group's list is empty
        picks = [[i for i in rest if reserved[i][0] == t] for t in range(len(rolled))]
        played += [r for group in play(sampler, renderer, [[reserved[i][2] for i in pick] for pick in picks],
                                       seed=seed + RESERVED_SEED, max_turns=max_turns,
                                       started=[[started[i] for i in pick] for pick in picks], **sampling)
                   for r in group]
        order += [i for pick in picks for i in pick]
    after = [[] for _ in rolled]
    for i, rollout in zip(order, played):
        after[reserved[i][0]].append(rollout)
    return [tuple(group) + tuple(more) for group, more in zip(rolled, after)]


def _play_reference(renderer, episode, messages: list[dict], turns: list, n: int, skip: int = 0,
                    who: str = 'scout (rlHyperparams.scout) "reference"') -> bool:
    """Play the environment's reference calls for the episode's task after the first `skip` (already played) up
    to the `n`th (fewer when its turn limit comes first), appending to `messages` and `turns` as a sampled turn
    would; whether the episode ended."""
    reference = getattr(episode.env, "reference_calls", None)
    if reference is None:
        instead = "use scout \"policy\"" if who.startswith("scout") else "leave referenceMembers at 0"
        raise StropError(f"{who} plays the environment's reference calls, and {type(episode.env).__name__} has no "
                         "reference_calls(task): give the environment one (the calls a good agent makes for a task, "
                         f"as ToolCalls), or {instead}")
    calls = list(reference(episode.task))[:min(n, episode.max_turns)]
    wrong = next((c for c in calls if not (isinstance(c, ToolCall) and isinstance(c.name, str)
                                           and isinstance(c.arguments, dict))), None)
    if wrong is not None:
        raise StropError(f"{type(episode.env).__name__}.reference_calls({episode.task.id!r}) must return ToolCalls "
                         f"(strop.tool_calls.ToolCall: a name and a dict of arguments); one was {wrong!r:.120}")
    tokenizer = renderer.tokenizer
    for i, call in enumerate(calls):
        if i < skip:
            continue
        text = hermes_turn({"role": "assistant", "content": "", "tool_calls": [{
            "id": call.id or f"call_{i}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}]})["content"]
        tokens = tuple(tokenizer.encode(text, add_special_tokens=False))
        # a scout's turn is never trained (a shared turn is masked as the prompt is); a guide's is priced after
        turns.append(Turn(prompt=episode.prompt(renderer, messages), tokens=tokens, logprobs=(0.0,) * len(tokens),
                          text=text, stop_reason="stop"))
        messages.append({"role": "assistant", "content": text})
        observation = episode.act(text)
        if observation is None:
            return True
        messages.append({"role": "tool", "content": observation})
    return False


def _replay(members: list, starts: list[list[dict]], prefixes: list) -> list[tuple[list[dict], list]]:
    """Each member's (messages, turns) after acting on its scout's replies again; StropError when an environment
    answers a replayed call differently (it is not deterministic, and the members would not share a state)."""
    def replay(i: int) -> tuple[list[dict], list]:
        t, _, episode = members[i]
        messages = list(starts[i])
        opening, scout_turns, observations = prefixes[t]
        if messages != opening:
            _differs(t, "its reset", str(messages[-1]["content"]), str(opening[-1]["content"]))
        for j, (turn, seen) in enumerate(zip(scout_turns, observations)):
            messages.append({"role": "assistant", "content": turn.text})
            observation = episode.act(turn.text)
            if observation != seen:
                _differs(t, f"turn {j + 1}", "the end of the episode" if observation is None else observation, seen)
            messages.append({"role": "tool", "content": observation})
        return messages, list(scout_turns)
    return each_episode(members)(replay, range(len(members)))


def _differs(task: int, where: str, got: str, seen: str) -> None:
    raise StropError(
        f"branch_at_turn (rlHyperparams.branchAtTurn): replaying task {task} of the step, {where} gave {got[:120]!r} "
        f"where the episode that was branched got {seen[:120]!r}; branching rebuilds the state by replaying its "
        "calls, so it needs an environment whose reset and step give the same observations for the same task and "
        "calls. Make the environment deterministic (seed what it draws), or train without branchAtTurn")


def identical_turns(group) -> int:
    """How many leading turns every rollout of the group wrote alike: the same prompt and the same tokens."""
    if len(group) < 2:
        return 0
    count = 0
    for turns in zip(*(r.turns for r in group)):
        first = turns[0]
        prompt = first.prompt.to_ints()
        if any(t.tokens != first.tokens or t.prompt.to_ints() != prompt for t in turns[1:]):
            break
        count += 1
    return count


def skips_identical(config) -> bool:
    """Whether a run leaves identical turns out: `identical_turns` skip, or auto where that changes no gradient."""
    if config.identical_turns == "auto":
        return config.loss_fn in CANCELLING_LOSSES and not config.kl_beta
    return config.identical_turns == "skip"


def untrained_turns(group, skip_identical: bool) -> list[int]:
    """Per rollout of a group, how many leading turns the update leaves out: its shared prefix (a branched
    group's), and, with `skip_identical`, the turns the whole group wrote alike."""
    alike = identical_turns(group) if skip_identical else 0
    return [max(r.shared_turns, alike) for r in group]


def branching_problems(config) -> list[tuple[str, str]]:
    """(field, problem) for branch_at_turn (identical_turns is one of its choices: the config checks that)."""
    p = []
    # its range is checked with every other number's (strop.rl.limits)
    n = config.branch_at_turn
    if n is not None and LIMITS["branch_at_turn"].problem(n) is None and config.environment is None:
        p.append(("branch_at_turn", "branches the episodes of a tool-use environment; a dataset's episodes have "
                                    "one turn: set environment, or leave branch_at_turn unset"))
    if config.scout != "policy" and not config.branch_at_turn:
        p.append(("scout", f"{config.scout!r} plays the turns before a branch; set branch_at_turn too, or leave scout "
                           "at \"policy\""))
    if config.scout == "reference" and config.scout_temperature is not None:
        p.append(("scout_temperature", "is the temperature the model plays the turns before a branch at, and scout "
                                       "\"reference\" plays the environment's calls there: leave one of them unset"))
    r, g = config.reference_members, config.group_size
    if _count(r, "reference_members") and r:
        if config.environment is None:
            p.append(("reference_members", "play an environment's reference calls; a dataset has none: set "
                                           "environment, or leave reference_members at 0"))
        if _count(g, "group_size") and r >= g:
            p.append(("reference_members", f"must be fewer than group_size ({g}): at least one episode of a group is "
                                           f"sampled (got {r})"))
        if config.branch_at_turn and config.branch_at_turn > 1 and config.scout != "reference":
            p.append(("reference_members", "go on from the scout's state with the reference calls after it, so the "
                                           "turns before the branch must be the reference's too: set scout "
                                           "\"reference\", or leave reference_members at 0"))
    if config.reference_when != "always" and not r:
        p.append(("reference_when", f"{config.reference_when!r} chooses the groups the reference members play in; "
                                    "set reference_members too, or leave reference_when at \"always\""))
    if config.scout_temperature is not None and not config.branch_at_turn:
        p.append(("scout_temperature", "is the temperature of the episode a branched group is played from; set "
                                       "branch_at_turn too, or leave scout_temperature unset"))
    return p


def _count(value, name: str) -> bool:
    """Whether `value` is a whole number within its setting's range (one that is not is reported by its field)."""
    return isinstance(value, int) and not isinstance(value, bool) and LIMITS[name].problem(value) is None
