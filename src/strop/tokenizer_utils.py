"""`get_tokenizer`, under the import path tinker-cookbook code uses, backed by strop's model resolution.

    from strop.tokenizer_utils import get_tokenizer
    tokenizer = get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")
    tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)

The tokenizer comes from the same local folder `strop.models.resolve_model` finds for the model (so it
works offline once the model is cached), has a pad token, pads on the left, and is shared between callers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strop.models.loading import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

__all__ = ["Tokenizer", "get_tokenizer"]


def get_tokenizer(model_name: str) -> "Tokenizer":
    """The tokenizer for `model_name` (Hub id, "strop/tiny-random" or a local model folder)."""
    return load_tokenizer(model_name)


def __getattr__(name: str):
    # `Tokenizer` is a type alias in tinker-cookbook; resolving it lazily keeps this import free of transformers.
    if name == "Tokenizer":
        # lazy: transformers is heavy or optional, loaded only when this runs
        from transformers import PreTrainedTokenizerBase

        return PreTrainedTokenizerBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
