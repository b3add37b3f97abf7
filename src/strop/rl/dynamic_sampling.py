"""Which groups of a step teach anything, and DAPO's dynamic sampling: draw further tasks until a step has
`batch_size` groups that do.

    flags = informative(groups, variance_on="correctness")   # [True, False, ...]: its episodes differ on that term
    groups = fill_groups(first, draw_round, batch_size=8, max_tasks=32, variance_on=None)
    kept = kept_groups(groups, variance_on=None, limit=8)     # indices of the groups the step trains on

A group whose episodes all score the same gives each of them an advantage of 0: it costs a forward and backward
pass and teaches nothing. Judged on the total reward, a group with no correct episode but different format
scores looks informative, and teaches only the format; `variance_on` names the term that must differ within a
group (a dataset's reward term, or a term an environment reports in its final `info["terms"]`, as finance-sql
reports `correctness` and `format`).

With dynamic sampling (DAPO, Yu et al. 2025) a step whose first batch has fewer than `batch_size` informative
groups draws further tasks, up to a batch at a time, until it has `batch_size` of them or has drawn `max_tasks`;
the first `batch_size` informative groups are trained and every other group drawn is dropped (the step's metrics
count both). Further tasks are drawn at random from the whole task list (`TaskDraws`), seeded by the run's seed,
the step and the round, so a resumed step draws the same ones; a task is drawn at most once a step.
"""

from __future__ import annotations

import random

import torch

from strop.errors import StropError
from strop.rl.advantages import is_zero_variance

ROUND_SEED = 100_003  # a further round's sampling seeds step past every group seed of the rounds before it


def reported_terms(rollout) -> dict:
    """The named scores of one episode: a dataset's reward terms, or those its environment reported at the end."""
    terms = rollout.info.get("terms") if isinstance(rollout.info, dict) else None
    return {**(terms if isinstance(terms, dict) else {}), **rollout.scores}


def informative(groups: list, variance_on: str | None = None) -> list[bool]:
    """Per group: whether its episodes differ on `variance_on` (None: on the total reward). An episode that does
    not report the term (one that ran out of turns before submitting) scores 0 on it; a term that no episode of
    the step reports while they report others is a mistake in the settings, and raises naming those. A step whose
    episodes report no named term at all (none of them submitted) is not: every group scores 0, and has no spread."""
    if variance_on is None:
        return [not is_zero_variance(torch.tensor([r.reward for r in group])) for group in groups]
    reported = [reported_terms(r) for group in groups for r in group]
    names = sorted({name for terms in reported for name in terms})
    if names and variance_on not in names:
        raise StropError(f"varianceOn {variance_on!r}: no episode of the step reports a term of that name; they report "
                         f"{', '.join(names)} (or judge on the total reward: null)")
    flags, at = [], 0
    for group in groups:
        values = [float(terms.get(variance_on, 0.0)) for terms in reported[at:at + len(group)]]
        at += len(group)
        flags.append(not is_zero_variance(torch.tensor(values)))
    return flags


def kept_groups(groups: list, variance_on: str | None = None, limit: int | None = None) -> list[int]:
    """Indices of the informative groups, in order: the first `limit` of them (None: all)."""
    kept = [g for g, ok in enumerate(informative(groups, variance_on)) if ok]
    return kept if limit is None else kept[:limit]


def fill_groups(first: list, draw_round, *, batch_size: int, max_tasks: int, variance_on: str | None = None) -> list:
    """Every group of a step: the first batch's, then rounds of further tasks while fewer than `batch_size` are
    informative and fewer than `max_tasks` were drawn. `draw_round(round, n)` samples the groups of up to `n`
    further tasks (round 1, 2, ...; fewer, or none, when the task list runs out)."""
    groups, round_ = list(first), 0
    while len(kept_groups(groups, variance_on)) < batch_size and len(groups) < max_tasks:
        round_ += 1
        more = draw_round(round_, min(batch_size, max_tasks - len(groups)))
        if not more:
            break
        groups += more
    return groups


class TaskDraws:
    """Further tasks for a step, at random from the run's task list (rows or an environment's tasks), never one
    the step already holds (the step's tasks are elements of the same list, so they are told apart by identity:
    rows need not be hashable)."""

    def __init__(self, items: list, seed: int):
        self.items, self.seed = items, seed

    def __call__(self, step: int, round_: int, n: int, taken: list) -> list:
        held = {id(item) for item in taken}
        n = min(n, len(self.items) - len(held))
        if n <= 0:
            return []
        rng = random.Random(f"strop-dynamic-sampling:{self.seed}:{step}:{round_}")
        if len(self.items) <= 4 * (len(held) + n):  # most of the list is held or wanted: pick from what is free
            free = [i for i, item in enumerate(self.items) if id(item) not in held]
            return [self.items[i] for i in rng.sample(free, n)]
        picked: dict[int, None] = {}  # most indices are free: fewer than two tries each, whatever the list's size
        while len(picked) < n:
            i = rng.randrange(len(self.items))
            if id(self.items[i]) not in held:
                picked.setdefault(i, None)
        return [self.items[i] for i in picked]


def max_tasks(config) -> int:
    """The most tasks dynamic sampling draws for one step of `config` (its first batch included)."""
    return config.max_tasks_per_step if config.max_tasks_per_step is not None else 4 * config.batch_size


def sampling_problems(config) -> list[tuple[str, str]]:
    """(field, problem) for the settings of dynamic sampling and varianceOn that do not fit together."""
    p = []
    if not isinstance(config.dynamic_sampling, bool):
        p.append(("dynamic_sampling", f"must be true or false, got {config.dynamic_sampling!r}"))
    cap, batch = config.max_tasks_per_step, config.batch_size
    if cap is not None and not config.dynamic_sampling:
        p.append(("max_tasks_per_step", "caps dynamic sampling's draws: turn dynamic_sampling on, or leave it unset"))
    elif isinstance(cap, int) and isinstance(batch, int) and not isinstance(cap, bool) and 1 <= cap < batch:
        p.append(("max_tasks_per_step", f"must be at least batch_size ({batch}): the step's own batch is drawn "
                                        f"first (got {cap})"))
    name = config.variance_on
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            p.append(("variance_on", f"must be a reward term's name, or None for the total reward; got {name!r}"))
        elif config.environment is None and isinstance(config.reward_terms, list):
            from strop.scoring.terms import default_name  # lazy: the grader machinery is not needed to check a name
            names = [t.get("name") or default_name(str(t.get("grader", ""))) for t in config.reward_terms
                     if isinstance(t, dict)]
            if name not in names:
                p.append(("variance_on", f"{name!r} is not one of the reward terms ({', '.join(names)})"))
    return p
