"""What a sampling engine and a trainer are: the interfaces `strop.client` speaks to, whichever implementation is
behind them.

Sampling engines: strop's own decoder (`strop.engine.sampler.SamplerEngine`), vLLM in a process of its own
(`strop.engine.vllm_engine.VllmEngine`) and replicas on a Ray cluster (`strop.cluster.samplers.RaySamplerEngine`).
Trainers: a LoRA trainer in this process (`strop.engine.trainer.LoraTrainer`) and one on Ray actors
(`strop.cluster.trainer.RemoteTrainer`). Each declares every member below, so the client never probes what an
implementation happens to have; `tests/test_layers.py` checks that each implementation has them all.

Episodes and where they come from are the loop's: `strop.rl.episodes` (`Episode`, `EpisodeSource`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from strop.engine.sample_types import AdapterWeights, SampleRequest
    from strop.types import AdamParams, Datum, ForwardBackwardOutput, SampleResponse


@runtime_checkable
class SamplingEngine(Protocol):
    """Samples, and scores given tokens, under a base model plus at most one adapter at a time."""

    continues_grammar: bool    # a json_schema sample can be continued from its own output (SampleRequest.resumed)
    continues_samples: bool    # a sample can be continued with its own generator (SampleRequest.generators)
    facts: dict                # what the engine is and where it runs, for engine.json (may be empty)

    @property
    def alive(self) -> bool:
        """False once the engine cannot answer any more (its process died): the client starts another."""

    def activate(self, adapter: AdapterWeights | None) -> None:
        """Make these adapter weights (None: the base alone) the ones the next calls use."""

    def generate(self, requests: list[SampleRequest]) -> list[SampleResponse]:
        """Each request's samples, in the order asked."""

    def prompt_logprobs(self, sequences: list[list[int]], max_batch_tokens: int = 8192) -> list[list[float | None]]:
        """Each token's logprob given those before it (None for the first)."""

    def prompt_topk(self, sequences: list[list[int]], k: int) -> list[list]:
        """At each position the k likeliest tokens and their logprobs (None at the first position)."""

    def close(self) -> None:
        """Free what the engine holds (a process, a cluster's actors); nothing is asked of it after."""


@runtime_checkable
class Trainer(Protocol):
    """A LoRA adapter on a base model, trained by forward_backward and optim_step."""

    model_dir: str | Path
    facts: dict                # where it trained (on Ray: the actors' hosts and devices); empty in this process
    max_tokens_per_batch: int | None

    @property
    def device(self):
        """The torch device it computes on in this process; None when it computes elsewhere (Ray)."""

    @property
    def compute_dtype(self):
        """The torch dtype its forward and backward run in."""

    def forward_backward(self, datums: list[Datum], loss_fn: str = "cross_entropy",
                         loss_fn_config: dict | None = None) -> ForwardBackwardOutput: ...

    def forward(self, datums: list[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> ForwardBackwardOutput: ...

    def optim_step(self, adam: AdamParams) -> dict[str, float]: ...

    def adapter_weights(self) -> AdapterWeights: ...

    def save_weights(self, path: str | Path) -> Path: ...

    def save_state(self, path: str | Path) -> Path: ...

    def load_state(self, path: str | Path, with_optimizer: bool = True) -> None: ...

    def close(self) -> None: ...


SAMPLING_ENGINE_MEMBERS = ("continues_grammar", "continues_samples", "facts", "alive", "activate", "generate",
                           "prompt_logprobs", "prompt_topk", "close")
TRAINER_MEMBERS = ("model_dir", "facts", "max_tokens_per_batch", "device", "compute_dtype", "forward_backward",
                   "forward", "optim_step", "adapter_weights", "save_weights", "save_state", "load_state", "close")
