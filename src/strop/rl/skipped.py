"""Updates skipped for a non-finite loss or gradient, counted over a run against its error limit.

    skipped = SkippedUpdates(config.max_reward_error_fraction)
    skipped.count(step, updated=True, skipped=row["updateSkipped"] == 1)   # StropError once too many were

The trainer skips an update whose loss or gradient is NaN or infinite (`strop.engine.trainer`), so the adapter
stays finite. One such step can be chance (a bf16 overflow); a run whose updates keep being skipped learns nothing
and must not end "succeeded", so it fails, with the cause, once more than the run's error limit
(max_reward_error_fraction, the same fraction that bounds a step's failed grader calls) of its updates so far
were skipped (a supervised run, which has no such setting: half). The updates so far count as at least
MIN_UPDATES until the last step, so the first update being skipped does not end a run on its own. Steps with nothing to train (every group of
equal rewards) made no update and do not count.
"""

from __future__ import annotations

from strop.errors import StropError

MIN_UPDATES = 4  # with the default limit (0.5), a run's first two skipped updates are chance; a third is not


class SkippedUpdates:
    def __init__(self, limit: float, setting: str = "max_reward_error_fraction / config.reward.maxErrorFraction"):
        self.limit, self.setting = limit, setting  # `setting`: where the limit is set, for the error
        self.updates = 0
        self.skipped = 0

    def count(self, step: int, updated: bool, skipped: bool, last: bool = False) -> None:
        """Count step `step`'s update (`updated`: it had something to train; `skipped`: the trainer skipped it);
        StropError when the skipped ones are now past the limit. At the `last` step the updates count as they
        are: a short run whose updates were all skipped has learned nothing and fails."""
        self.updates += bool(updated)
        self.skipped += bool(updated and skipped)
        if self.skipped and self.skipped > self.limit * (self.updates if last else max(self.updates, MIN_UPDATES)):
            raise StropError(
                f"step {step}: {self.skipped} of the run's {self.updates} updates so far were skipped because "
                f"their loss or gradient was not a finite number (NaN or infinity), more than the {self.limit:.0%} "
                f"allowed ({self.setting}); the adapter was left as it "
                "was before each of them. Look for rewards far from the others' scale, or lower the learning rate")
