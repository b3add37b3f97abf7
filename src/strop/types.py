"""The data types of strop's Tinker-style API.

They carry the same names and fields as Tinker's, so a loop written for Tinker runs here with only its imports
changed:

    from strop import types
    prompt = types.ModelInput.from_ints([1, 2, 3])
    full = prompt.append(types.EncodedTextChunk(tokens=[4, 5]))        # a new ModelInput, length 5
    datum = types.Datum(model_input=full, loss_fn_inputs={
        "target_tokens": types.TensorData.from_torch(torch.tensor([2, 3, 4, 5, 6])),
        "logprobs": ..., "advantages": ...})

Hand-offs: ModelInput (tokens in) -> SampleResponse (sequences with tokens and per-token logprobs) -> Datum
(model input + per-position loss inputs) -> ForwardBackwardOutput (per-datum logprobs + summed metrics).
Loss inputs are aligned with the model input: position t holds what the model predicts after reading
tokens[0..t], so `target_tokens[t]` is the token that follows input token t.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from strop.engine.losses import LOSSES
from strop.errors import StropError

if TYPE_CHECKING:
    import torch
# torch itself is imported where a tensor is made: `strop.types` is read by light callers too (a renderer checking a
# transcript while a dataset is registered), which must not pay torch's 2-3 s import

LossFnType = Literal[tuple(LOSSES)]  # the engine's losses by name (strop.engine.losses)
StopReason = Literal["stop", "length"]


@dataclass(frozen=True)
class EncodedTextChunk:
    """A run of token ids inside a ModelInput."""

    tokens: Sequence[int]
    type: Literal["encoded_text"] = "encoded_text"

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class ModelInput:
    """What the model reads: a sequence of chunks (text tokens only, for now)."""

    chunks: tuple[EncodedTextChunk, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "chunks", tuple(self.chunks))

    @classmethod
    def from_ints(cls, tokens: Sequence[int]) -> ModelInput:
        return cls(chunks=(EncodedTextChunk(tokens=tokens),))

    @classmethod
    def empty(cls) -> ModelInput:
        return cls(chunks=())

    def to_ints(self) -> list[int]:
        return [t for chunk in self.chunks for t in chunk.tokens]

    @property
    def length(self) -> int:
        return sum(chunk.length for chunk in self.chunks)

    def append(self, chunk: EncodedTextChunk) -> ModelInput:
        """A new ModelInput with `chunk` at the end; this one is unchanged."""
        return ModelInput(chunks=(*self.chunks, chunk))

    def append_int(self, token: int) -> ModelInput:
        return self.append(EncodedTextChunk(tokens=(token,)))


@dataclass(frozen=True)
class TensorData:
    """A tensor in a form that crosses process boundaries: flat values, dtype name and shape."""

    data: tuple
    dtype: Literal["int64", "float32"]
    shape: tuple[int, ...] | None = None

    @classmethod
    def from_torch(cls, tensor: torch.Tensor) -> TensorData:
        tensor = tensor.detach().cpu()
        dtype = "float32" if tensor.is_floating_point() else "int64"
        return cls(data=tuple(tensor.reshape(-1).tolist()), dtype=dtype, shape=tuple(tensor.shape))

    @classmethod
    def from_numpy(cls, array: np.ndarray) -> TensorData:
        import torch  # lazy: see the top of this module

        return cls.from_torch(torch.from_numpy(np.ascontiguousarray(array)))

    def to_torch(self) -> torch.Tensor:
        import torch  # lazy: see the top of this module

        tensor = torch.tensor(self.data, dtype={"int64": torch.int64, "float32": torch.float32}[self.dtype])
        return tensor.reshape(self.shape) if self.shape is not None else tensor

    def to_numpy(self) -> np.ndarray:
        return self.to_torch().numpy()

    def tolist(self) -> list:
        return self.to_torch().tolist()


def as_tensor_data(value: Any) -> TensorData:
    """Accept what users naturally pass as a loss input: TensorData, a torch tensor, a numpy array, a list."""
    import torch  # lazy: see the top of this module

    if isinstance(value, TensorData):
        return value
    if isinstance(value, torch.Tensor):
        return TensorData.from_torch(value)
    if isinstance(value, np.ndarray):
        return TensorData.from_numpy(value)
    if isinstance(value, (list, tuple)):
        return TensorData.from_torch(torch.tensor(value))
    raise StropError(f"a loss input must be TensorData, a torch tensor, a numpy array or a list, not {type(value).__name__}")


@dataclass(frozen=True)
class Datum:
    """One training example: the model input and its per-position loss inputs.

    Loss inputs by loss function (each the same length as `model_input`):
      cross_entropy:        target_tokens, weights
      importance_sampling:  target_tokens, logprobs (the sampler's), advantages
      ppo, cispo, dro:      target_tokens, logprobs (the sampler's), advantages
    """

    model_input: ModelInput
    loss_fn_inputs: dict[str, TensorData] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "loss_fn_inputs", {k: as_tensor_data(v) for k, v in self.loss_fn_inputs.items()})


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `stop` is a list of strings or a list of token ids; `seed` makes sampling repeatable.

    `json_schema` (a strop extension) constrains the output to JSON valid under that schema by
    grammar-constrained decoding: tokens the grammar forbids are masked out before each choice.
    """

    max_tokens: int | None = None
    seed: int | None = None
    stop: Sequence[str] | Sequence[int] | str | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    json_schema: dict | str | None = None

    def __post_init__(self):
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise StropError(f"SamplingParams.max_tokens must be a positive number of tokens, got {self.max_tokens}")
        if self.temperature < 0:
            raise StropError(f"SamplingParams.temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise StropError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise StropError(f"SamplingParams.top_k must be a positive count, or -1 for no limit; got {self.top_k}")
        if isinstance(self.json_schema, dict):  # kept as JSON text (property order kept: it is the order of generation), so params stay hashable
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        elif self.json_schema is not None and not isinstance(self.json_schema, str):
            raise StropError(f"SamplingParams.json_schema must be a JSON schema (a dict or its JSON text), got {type(self.json_schema).__name__}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is not None:
            object.__setattr__(self, "stop", tuple(self.stop))


@dataclass(frozen=True)
class AdamParams:
    """AdamW settings for one optimizer step. `grad_clip_norm` 0 means no clipping."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self):
        if self.learning_rate < 0:
            raise StropError(f"AdamParams.learning_rate must be >= 0, got {self.learning_rate}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise StropError(f"AdamParams.{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(frozen=True)
class SampledSequence:
    """One sampled continuation: its tokens (a stop token included), each token's logprob, and why it ended."""

    stop_reason: StopReason
    tokens: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class SampleResponse:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None


@dataclass(frozen=True)
class ForwardBackwardOutput:
    """Per-datum outputs (`logprobs` of each target token, plus `entropy`) and metrics summed over datums.

    Metric names end in their reduction, as Tinker's do: `loss:sum`, `tokens:sum`, `entropy:sum`."""

    loss_fn_output_type: str
    loss_fn_outputs: list[dict[str, TensorData]]
    metrics: dict[str, float]


@dataclass(frozen=True)
class OptimStepResponse:
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SaveWeightsResponse:
    path: str


@dataclass(frozen=True)
class LoadWeightsResponse:
    path: str
