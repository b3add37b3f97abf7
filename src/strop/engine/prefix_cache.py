"""Keys and values of recent prompts, kept so that a prompt which extends one of them prefills only its new tokens.

A tool-use episode's turn t+1 reads turn t's prompt, the reply and the tool's answer: without a cache every turn
prefills the whole conversation again (a 5-turn finance-sql episode: ~6,300 prompt tokens prefilled for a
~1,700-token conversation). The samplers of one step also share long prefixes (a system prompt and tool schemas).
The engine adds each prompt it prefills here and looks up, for each new prompt, the cached one sharing its
longest prefix; the keys and values of that many positions are reused as they are (a position's keys and values
depend only on the tokens up to it, under fixed weights).

    cache = PrefixCache(max_bytes=2 << 30)
    tokens, length = cache.longest(prompt)      # the entry sharing the longest prefix, and how long it is
    cache.layers(tokens)                        # [(keys [kv_heads, L, head_dim], values), ...] per layer
    cache.add(prompt, layers, replaces=tokens)  # the entry it extends is dropped: the new one covers it

Entries are dropped least recently used first past `max_bytes`, and all of them whenever the weights change
(an adapter switched: `clear()`). An entry bigger than the whole budget is not kept.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import torch

from strop.errors import StropError

MIN_REUSE = 16          # tokens: a shorter shared prefix is prefilled again (not worth the batch's cache padding)
MAX_ENTRIES = 1024      # bounds the lookup's cost whatever the byte budget
DEFAULT_SHARE = 0.2     # of the memory available when the engine starts
DEFAULT_CAP = 4 << 30   # bytes


def default_budget() -> int:
    """Bytes for the cache: STROP_PREFIX_CACHE_MB when set (0 turns the cache off), else a fifth of the memory
    available now, at most 4 GiB."""
    given = os.environ.get("STROP_PREFIX_CACHE_MB")
    if given is not None:
        try:
            return max(0, int(given)) << 20
        except ValueError:
            raise StropError(f"STROP_PREFIX_CACHE_MB must be a whole number of MiB (0: no cache), got {given[:40]!r}") from None
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        available = 4 << 30
    return int(min(DEFAULT_CAP, available * DEFAULT_SHARE))


class PrefixCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, prompt: list[int] | tuple[int, ...]) -> tuple[tuple[int, ...] | None, int]:
        """The entry sharing the longest prefix with `prompt` and that length, at most len(prompt) - 1 (the last
        position is always run, for its logits); (None, 0) when no entry shares MIN_REUSE tokens."""
        if not self._entries or len(prompt) <= MIN_REUSE:
            return None, 0
        wanted = torch.tensor(prompt, dtype=torch.long)
        best, best_n = None, MIN_REUSE - 1
        for key, (tokens, _, _) in self._entries.items():
            m = min(len(tokens), len(prompt) - 1)
            if m <= best_n:
                continue
            differ = (tokens[:m] != wanted[:m]).nonzero()
            n = int(differ[0]) if len(differ) else m
            if n > best_n:
                best, best_n = key, n
        if best is None:
            return None, 0
        self._entries.move_to_end(best)
        self.hits += 1
        self.reused_tokens += best_n
        return best, best_n

    def layers(self, key: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self._entries[key][1]

    def add(self, prompt: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]],
            replaces: tuple[int, ...] | None = None) -> None:
        """Keep `prompt`'s keys and values ([kv_heads, len(prompt), head_dim] per layer). `replaces`: an entry
        this one extends, dropped now (everything it could give, the new one gives)."""
        if replaces is not None and replaces in self._entries and prompt[:len(replaces)] == replaces:
            self._drop(replaces)
        if prompt in self._entries:
            self._entries.move_to_end(prompt)
            return
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if size > self.max_bytes:
            return
        while self._entries and (self.bytes + size > self.max_bytes or len(self._entries) >= MAX_ENTRIES):
            self._drop(next(iter(self._entries)))
        self._entries[prompt] = (torch.tensor(prompt, dtype=torch.long), layers, size)
        self.bytes += size

    def _drop(self, key: tuple[int, ...]) -> None:
        self.bytes -= self._entries.pop(key)[2]

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
