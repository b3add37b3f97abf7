"""Headroom before compute: does RL have anything to convert? Each task is played once greedily and K times
sampled; per kind of task (and per split, and overall) this reports greedy pass@1, sampled pass@1 (the mean
success rate over the K samples), pass@K (unbiased, n = K: any sample right) and the RL pool: the tasks solved
between 1 and K-1 times, the only ones on which a GRPO group of K has a non-zero advantage to learn from.

    outcomes = [TaskOutcome("eval-multi", 0, "t0", "growth_gap", greedy=False, successes=2, samples=4)]
    headroom(outcomes, samples=4)["all"]   # {"tasks": 1, "greedyPass@1": 0.0, "sampledPass@1": 0.5, "pass@4": 1.0, ...}

Pure functions, no I/O; tests check them against figures worked out by hand.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from strop.evals.runner import pass_at_k
from strop.rl.limits import LIMITS, Limit

NO_KIND = "-"  # tasks whose environment gives no meta["kind"]
# at most this many sampled episodes are played at once (each holds an environment), whatever the task count
EPISODES_AT_ONCE = 256

SAMPLES = Limit(2, LIMITS["group_size"].most, True,
                "the RL pool is read against GRPO groups of that size, and every task plays that many episodes",
                why_least="one sample cannot tell a task solved sometimes from one solved always")


@dataclass(frozen=True)
class TaskOutcome:
    split: str
    index: int           # the task's place in env.tasks(split)
    task_id: str
    kind: str | None
    greedy: bool         # the greedy episode passed
    successes: int       # sampled episodes that passed, of `samples`
    samples: int

    def __post_init__(self):
        if not 0 <= self.successes <= self.samples:
            raise ValueError(f"successes must be between 0 and samples={self.samples}, got {self.successes}")


def in_pool(successes: int, samples: int, least: int = 1) -> bool:
    """Solved sometimes but not always: a group of `samples` has both a success and a failure to compare. With
    `least` above 1, solved and missed at least that many times each: a task seen right once in 8 is mostly rarer
    than that (on finance-sql, 10 of 17 tasks solved once in 8 were solved in none of 8 samples more), and a group
    at a true rate of 1 in 20 has both outcomes only a third of the time."""
    return least <= successes <= samples - least


def figures(outcomes: list[TaskOutcome], samples: int) -> dict:
    n = len(outcomes)
    if n == 0:
        return {"tasks": 0}
    return {"tasks": n,
            "greedyPass@1": sum(o.greedy for o in outcomes) / n,
            "sampledPass@1": statistics.fmean(pass_at_k(samples, o.successes, 1) for o in outcomes),
            f"pass@{samples}": statistics.fmean(pass_at_k(samples, o.successes, samples) for o in outcomes),
            "rlPool": sum(in_pool(o.successes, samples) for o in outcomes),
            "neverSolved": sum(o.successes == 0 for o in outcomes),
            "alwaysSolved": sum(o.successes == samples for o in outcomes)}


def headroom(outcomes: list[TaskOutcome], samples: int) -> dict:
    """Figures per split and kind, per split, and over every task."""
    splits: dict[str, dict] = {}
    for split in dict.fromkeys(o.split for o in outcomes):
        mine = [o for o in outcomes if o.split == split]
        kinds = dict.fromkeys(o.kind or NO_KIND for o in mine)
        splits[split] = {"kinds": {k: figures([o for o in mine if (o.kind or NO_KIND) == k], samples) for k in kinds},
                         "all": figures(mine, samples)}
    return {"samples": samples, "splits": splits, "all": figures(outcomes, samples)}


def pool_rows(outcomes: list[TaskOutcome], environment: str, options: dict, least: int = 1) -> list[dict]:
    """One row per RL-pool task (solved and missed at least `least` times each): enough to find it again
    (environment, its options, split, index, id)."""
    return [{"environment": environment, "options": options, "split": o.split, "index": o.index, "task": o.task_id,
             "kind": o.kind, "successes": o.successes, "samples": o.samples}
            for o in outcomes if in_pool(o.successes, o.samples, least)]
