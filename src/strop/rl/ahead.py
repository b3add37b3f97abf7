"""Off-policy steps: sample the next steps while the trainer updates on this one.

    ahead = SampleAhead(ctx, items_of_step, steps=100, max_ahead=1)
    for step in range(100):
        sampled, waited = ahead.take(step)       # this step's rollouts, and how long the trainer waited for them
        metrics = learn_step(ctx, sampled, waited=waited)
    ahead.close()

With `max_ahead` = k, when step s is taken the rollouts of steps s+1 .. s+k are started under the weights as
they are then (s updates), in one background thread, so they are sampled while step s trains: steady state, each
step trains on rollouts k updates old. The sampler's logprobs travel with the rollouts, so the importance-sampling
losses weigh each token by p_train / p_sampler (and `rolloutCorrection` caps that weight). The step's seed is its
own whatever the weights, and rollouts in flight when a run stops are dropped: a resumed run samples them again
from its checkpoint's weights.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from strop.rl.step import Sampled, StepContext, sample_step


class SampleAhead:
    def __init__(self, ctx: StepContext, items_of, steps: int, max_ahead: int):
        self.ctx, self.items_of, self.steps, self.max_ahead = ctx, items_of, steps, max_ahead
        self.pending: dict[int, Future] = {}
        self.next: int | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strop-sample-ahead")

    def take(self, step: int) -> tuple[Sampled, float]:
        if self.next is None or step >= self.next:  # the first step taken, or one past what was started
            self.next = step
        sampler = None
        while self.next <= min(step + self.max_ahead, self.steps - 1):
            # every step started now samples under the weights as they are now: one snapshot for all of them
            sampler = sampler or self.ctx.training.save_weights_and_get_sampling_client()
            self.pending[self.next] = self.pool.submit(sample_step, self.ctx, self.next, self.items_of(self.next),
                                                       sampler, step)
            self.next += 1
        t0 = time.perf_counter()
        sampled = self.pending.pop(step).result()
        return sampled, time.perf_counter() - t0

    def close(self) -> None:
        """Drop the rollouts not yet taken (a sampling already running finishes first: it cannot be cut short)."""
        for future in self.pending.values():
            future.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()
