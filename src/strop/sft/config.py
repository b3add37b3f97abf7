"""The settings of one supervised run: what every training run sets (`strop.rl.settings.TrainingSettings`) and
the few only supervised fine-tuning has.

    config = SFTConfig(base_model="strop/tiny-random", dataset="demos.jsonl", max_steps=20)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from strop.errors import StropError
from strop.rl.settings import TrainingSettings, setting


@dataclass
class SFTConfig(TrainingSettings):
    METHOD: ClassVar[str] = "sft"
    HYPERPARAMS: ClassVar[str] = "sftHyperparams"

    dataset: str = setting("", "a .jsonl of chat transcripts ({\"messages\": [...], \"tools\": [...]}, e.g. from "
                           "`strop envs demos`) or prompt/completion pairs (strop.sft.data)", flag="--dataset")
    eval_fraction: float = setting(0.1, "share of the examples held out for the held-out loss (at least one "
                                   "example)", flag="--eval-fraction", descriptor="{hp}.evalFraction")
    max_seq_length: int = setting(2048, "refuse examples longer than this many tokens", flag="--max-seq-length",
                                  descriptor="config.maxSeqLength")
    eval_every: int | None = setting(None, "held-out loss every N steps (unset: before the first step and at the "
                                     "end only)", flag="--eval-every", metavar="N")
    ray: dict | None = setting(None, '{"address": "auto" | "HOST:PORT", "trainers": N}: train on a Ray cluster '
                               '(strop.cluster); unset: in this process')

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise StropError("invalid supervised config:\n  " + "\n  ".join(problems))

    def problems(self) -> list[str]:
        found = [f"{name}: {problem}" for name, problem in self.shared_problems()]
        if not isinstance(self.dataset, str) or not self.dataset:
            found.append("dataset: give a .jsonl file of chat transcripts or prompt/completion pairs")
        if not (isinstance(self.eval_fraction, (int, float)) and 0 <= self.eval_fraction < 1):
            found.append(f"eval_fraction: must be a share from 0 up to (not including) 1, got {self.eval_fraction!r}")
        return found

    def to_dict(self) -> dict:
        return asdict(self)
