"""Progress bars on stderr for work that a background worker does: `on_poll` callbacks for the waits.

    with EvalBar() as bar:
        evaluations.wait(evaluation_id, on_poll=bar.update)
"""

from __future__ import annotations

import sys


class EvalBar:
    """One bar per phase of an evaluation (generate, then judge), with running accuracy while generating."""

    def __init__(self, label: str = ""):
        self.label, self.bar, self.phase = label, None, None

    def update(self, info: dict) -> None:
        # lazy: tqdm is heavy or optional, loaded only when this runs
        from tqdm import tqdm
        progress = info.get("progress")
        if not progress:
            return
        if progress["phase"] != self.phase:
            self.close()
            self.phase = progress["phase"]
            desc = f"{self.label} {self.phase}".strip()
            # progress is polled, so it arrives in jumps: rate = items seen done since the bar began / its time
            # (tqdm's default smoothing turned the first jump into "745654 item/s"); work done before then is
            # the bar's initial count and does not enter the rate
            self.bar = tqdm(total=progress["total"], desc=desc, unit="item", file=sys.stderr, dynamic_ncols=True,
                            initial=progress["done"], smoothing=0)
        self.bar.update(progress["done"] - self.bar.n)
        if "correct" in progress and progress["done"]:
            self.bar.set_postfix(accuracy=f"{progress['correct'] / progress['done']:.1%}")

    def close(self) -> None:
        if self.bar is not None:
            if self.phase is not None and self.bar.n < self.bar.total:
                self.bar.update(self.bar.total - self.bar.n)  # finished between two polls
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RunBar:
    """Steps of a run, with the last step's reward and zero-variance groups (GRPO) or its loss (SFT)."""

    def __init__(self, run_id: str, steps: int, desc: str = "train"):
        # lazy: tqdm is heavy or optional, loaded only when this runs
        from tqdm import tqdm
        self.run_id = run_id
        self.bar = tqdm(total=steps, desc=desc, unit="step", file=sys.stderr, dynamic_ncols=True, smoothing=0)

    def update(self, info: dict) -> None:
        # lazy: strop.control.runs pulls in sqlalchemy, which importing this module does not need
        from strop.control import runs
        rows = [r for r in runs.metrics(self.run_id) if r.get("step", 0) >= 0]  # SFT's step -1: held-out loss
        self.bar.update(len(rows) - self.bar.n)
        if rows and "loss" in rows[-1] and "reward" not in rows[-1]:
            self.bar.set_postfix(loss=f"{rows[-1]['loss']:.3f}")
        elif rows:
            self.bar.set_postfix(reward=f"{rows[-1].get('reward', 0):.3f}",
                                 zvg=f"{rows[-1].get('zeroVarianceGroups', 0):.2f}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()


class EpisodeBar(EvalBar):
    """Episodes of an environment evaluation, one bar per split."""

    def update(self, split: str, finished: int, total: int) -> None:
        # lazy: tqdm is heavy or optional, loaded only when this runs
        from tqdm import tqdm
        if split != self.phase:
            self.close()
            self.phase = split
            self.bar = tqdm(total=total, desc=f"{self.label} {split}", unit="episode", file=sys.stderr,
                            dynamic_ncols=True, smoothing=0)
        self.bar.update(finished - self.bar.n)
