"""OpenAI's `logprobs` for `strop serve`'s replies: each sampled token of the reply's text with its logprob, and
with `top_logprobs: k` the k likeliest tokens at its place.

    choice["logprobs"] = {"content": token_logprobs(tokens, logprobs, top, describe), "refusal": None}
    # content[j] = {"token": "Hello", "logprob": -0.3, "bytes": [72, ...], "top_logprobs": [{token, logprob, bytes}]}

The logprobs are the model's own (temperature 1, before top-p or a json_schema grammar narrowed the choice), as the
engine returns them; the top k come from one teacher-forced pass over the prompt and the reply, the same
distribution the sampled token was drawn from before any of that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
UNLIKELY = -9999.0     # OpenAI's stand-in for a logprob too small to name (JSON has no -Infinity)


def text_tokens(tokens: list[int], text: str, decode: Callable[[list[int]], str]) -> int:
    """How many of `tokens` it takes to write `text` (the reply as cut at a stop): the tokens whose logprobs
    the reply shows. A binary search, so a 4,096-token reply costs a dozen decodes, not thousands."""
    low, high = 0, len(tokens)
    while low < high:
        middle = (low + high) // 2
        if len(decode(tokens[:middle])) >= len(text):
            high = middle
        else:
            low = middle + 1
    return low


def token_logprobs(tokens: list[int], logprobs: list[float], top: list[list[tuple[int, float]]] | None,
                   describe: Callable[[int], tuple[str, list[int] | None]]) -> list[dict]:
    """OpenAI's logprobs.content for sampled `tokens` (with `top`, the k likeliest at each place, or None)."""
    content = []
    for j, (token, logprob) in enumerate(zip(tokens, logprobs)):
        text, data = describe(token)
        alternatives = []
        for other, value in (top[j] if top is not None else ()):
            other_text, other_data = describe(other)
            alternatives.append({"token": other_text, "logprob": _finite(value), "bytes": other_data})
        content.append({"token": text, "logprob": _finite(logprob), "bytes": data, "top_logprobs": alternatives})
    return content


def _finite(value: float) -> float:
    return value if math.isfinite(value) else UNLIKELY


def describer(tokenizer) -> Callable[[int], tuple[str, list[int] | None]]:
    """A token id's text and UTF-8 bytes. A byte-level BPE token (GPT-2's, SmolLM2's, Llama 3's) that holds part of
    a character has its own bytes, which its text (a replacement character) would lose."""
    to_byte = _byte_level_alphabet()

    @lru_cache(maxsize=65_536)
    def describe(token: int) -> tuple[str, list[int] | None]:
        text = tokenizer.decode([token])
        piece = tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str) and piece and all(c in to_byte for c in piece):
            data = bytes(to_byte[c] for c in piece)
            shown = data.decode("utf-8", errors="replace")
            if shown == text or "\ufffd" in shown:  # the piece is the token's bytes (not a special token's name)
                return text, list(data)
        return text, list(text.encode("utf-8"))
    return describe


def _byte_level_alphabet() -> dict[str, int]:
    """The characters byte-level BPE writes each byte as (printable bytes as themselves, the rest shifted past
    255), mapped back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shown, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            shown[chr(byte)] = byte
        else:
            shown[chr(256 + extra)] = byte
            extra += 1
    return shown
