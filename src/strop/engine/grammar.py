"""JSON-schema sampling in strop's sampler: each schema compiled once to an xgrammar grammar (the most recently used
kept), a fresh matcher per sample, and the mask that leaves a row only the tokens its grammar allows next.

xgrammar is optional and heavy: it is imported only when a request asks for a json_schema.
"""

from __future__ import annotations

import torch

GRAMMAR_CACHE_SIZE = 32  # compiled JSON-schema grammars kept, least recently used dropped first
GRAMMAR_CACHE_BYTES = 256 << 20


class Grammars:
    """One engine's compiled grammars, by schema, least recently used first (iterating gives the schemas kept), with
    the compiler for its vocabulary and the one token bitmask every masked row and token reuses.

    The tokenizer, vocabulary size and stop ids are given with each call, not kept: the compiler is built from them
    at the first schema."""

    def __init__(self):
        self._compiled: dict[str, object] = {}
        self._compiler = None
        self._bitmask = None  # reused for every masked row and token: one allocation per engine

    def __len__(self) -> int:
        return len(self._compiled)

    def __iter__(self):
        return iter(self._compiled)

    def matcher(self, schema: str, tokenizer, vocab_size: int, stop_ids: frozenset[int]):
        """A fresh grammar matcher for a JSON schema (xgrammar; the compiled grammar is cached per schema)."""
        # lazy: xgrammar is heavy or optional, loaded only when this runs
        import xgrammar
        if tokenizer is None:
            raise ValueError("json_schema sampling needs a tokenizer; give the sampler one")
        if self._compiler is None:
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                           stop_token_ids=sorted(stop_ids) or None)
            # xgrammar's own cache is bounded too: a server sees schemas from every client
            self._compiler = xgrammar.GrammarCompiler(info, cache_limit_bytes=GRAMMAR_CACHE_BYTES)
        grammar = self._compiled.pop(schema, None)
        if grammar is None:
            try:
                grammar = self._compiler.compile_json_schema(schema, any_whitespace=False)
            except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its parser's message
                raise ValueError(f"json_schema cannot be compiled to a grammar: {exc}") from None
        self._compiled[schema] = grammar  # most recently used last
        while len(self._compiled) > GRAMMAR_CACHE_SIZE:
            del self._compiled[next(iter(self._compiled))]
        return xgrammar.GrammarMatcher(grammar)

    def mask(self, logits_B_V: torch.Tensor, b: int, matcher, vocab_size: int) -> None:
        """Set row b's logits, in place, to -inf for every token the matcher does not allow next."""
        # lazy: xgrammar is heavy or optional, loaded only when this runs
        import xgrammar
        if self._bitmask is None:
            self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        matcher.fill_next_token_bitmask(self._bitmask, 0)
        row_V = logits_B_V[b:b + 1, :vocab_size]
        xgrammar.apply_token_bitmask_inplace(row_V, self._bitmask)


def resume(matcher, output: list[int]) -> None:
    """Bring a fresh grammar matcher to where a continued sample left off: past the output it has already written."""
    for token in output:
        if not matcher.accept_token(token):
            raise ValueError("a continued sample's output so far does not follow its json_schema; continue only "
                             "output that was generated under the same schema")
