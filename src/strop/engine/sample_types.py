"""What strop's sampler is asked for and what it keeps while it works: an adapter in the form it merges, a sampling
request, one row per sample being generated, and each sample's seed.

These are shared by the engines (`strop.engine.sampler`, `strop.engine.vllm_engine`) and the trainer, which hands
its adapter over as `AdapterWeights`; `strop.engine.sampler` re-exports them where callers import them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from strop.types import SamplingParams

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class AdapterWeights:
    """A LoRA adapter as the sampler merges it: per target module (base-model name), A (r x in) and B (out x r)."""

    deltas: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scaling: float

    def delta(self, name: str) -> torch.Tensor:
        lora_a, lora_b = self.deltas[name]
        return (lora_b.float() @ lora_a.float()) * self.scaling


@dataclass(frozen=True)
class SampleRequest:
    prompt_tokens: list[int]
    num_samples: int
    params: SamplingParams
    # how many of the prompt's last tokens are this sample's own output so far (a generation continued in chunks, as
    # `strop serve` runs one): a json_schema grammar takes them before it masks the first new token
    resumed: int = 0
    # the samples' random generators (one a sample), carried from an earlier chunk of the same samples: a generation
    # served in chunks (the Tinker server's) draws what it would have drawn whole; None: seeded from params.seed
    generators: list[torch.Generator] | None = None


@dataclass
class Row:
    """One sample being generated."""

    prompt_index: int
    generator: torch.Generator
    params: SamplingParams
    max_tokens: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None
    matcher: object | None = None  # an xgrammar GrammarMatcher when the output is held to a JSON schema


def row_seed(seed: int, index: int) -> int:
    # spread (seed, index) pairs apart so request seed 1 sample 0 differs from seed 0 sample 1
    return (seed * 1_000_003 + index * 7_919 + 17) % (2**63 - 1)
