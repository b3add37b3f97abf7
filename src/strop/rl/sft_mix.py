"""A supervised loss beside the policy's (InstructGPT's PPO-ptx, here on a warm start's own demonstrations).

A GRPO step learns only from the groups whose rewards differ. When those are a few tasks of one kind, their
gradient moves whatever the model shares between kinds (a SQL template, a rounding habit), and the kinds that had
no informative group that step drift with it: nothing in the policy loss holds them. Mixing in the cross-entropy
of the transcripts the run started from holds them where the warm start put them, while the policy gradient
moves what the rewards say:

    mix = SFTMix.load(config, renderer)         # None when config.sft_mix is unset
    datums = mix.batch(step=3, update=0)        # sft_mix_examples transcripts, each token weighted sft_mix_weight

Each optimizer step adds `training.forward_backward(datums, "cross_entropy")` to its policy loss's gradient
before it steps (strop.rl.updates). The draw is seeded by the run's seed, the step and the optimizer step, so a
resumed run trains on what the uninterrupted one would have. Turns a transcript marks `"weight": 0` (a
demonstration's deliberate mistake) stay untrained here as in `strop sft`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from strop import types
from strop.errors import StropError
from strop.sft.data import Example, check_file, example_datum, load_examples

DEFAULT_MAX_SEQ_LENGTH = 4096  # tokens of a transcript when the run sets no max_seq_length


@dataclass(frozen=True)
class SFTMix:
    examples: tuple[Example, ...]
    weight: float
    per_step: int
    seed: int

    @classmethod
    def load(cls, config, renderer) -> SFTMix | None:
        """The run's mix (config.sft_mix, sft_mix_weight, sft_mix_examples), its transcripts rendered as the
        run's model reads them; None without one. A file that is not a supervised .jsonl is refused with its
        lines' problems (strop.sft.data), before the run's folder is written."""
        if not config.sft_mix:
            return None
        examples = load_examples(config.sft_mix, renderer,
                                 max_seq_length=config.max_seq_length or DEFAULT_MAX_SEQ_LENGTH)
        trained = [e for e in examples if e.trained]
        if not trained:
            raise StropError(f"sft_mix {config.sft_mix}: no transcript has a trained turn (every assistant turn has "
                             "weight 0), so it holds nothing in place; give the warm start's transcripts")
        return cls(tuple(trained), float(config.sft_mix_weight), int(config.sft_mix_examples), int(config.seed))

    @staticmethod
    def check(config) -> None:
        """Refuse a config.sft_mix that is not a supervised .jsonl, naming its bad lines: the early check a run
        makes before its model loads (the transcripts are rendered once the model's tokenizer is there)."""
        if config.sft_mix:
            check_file(config.sft_mix)

    def batch(self, step: int, update: int = 0) -> list[types.Datum]:
        """The transcripts of one optimizer step (the `update`-th of step `step`), in file order, each token's
        weight times the mix's weight; every transcript when the file holds fewer than examples a step."""
        rng = random.Random(f"sft-mix:{self.seed}:{step}:{update}")
        chosen = sorted(rng.sample(range(len(self.examples)), min(self.per_step, len(self.examples))))
        return [example_datum(self.examples[i], scale=self.weight) for i in chosen]

    @staticmethod
    def weighted_tokens(datums: list[types.Datum]) -> float:
        """The sum of `datums`' token weights: the trained tokens times the mix's weight, what its cross-entropy's
        sum is divided by for the loss per token."""
        return sum(float(d.loss_fn_inputs["weights"].to_torch().sum()) for d in datums)


__all__ = ["SFTMix"]
