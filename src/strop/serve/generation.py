"""How `strop serve` runs one request's generation: in chunks, each chunk one turn at the engine.

    sequences = generate(sampler, prompt, n=2, params=params, decode=tokenizer.decode, gone=client_gone,
                         turn=lambda: turns.turn(address, connection))      # None: the client left

The engine cannot stop a generation midway, so it is asked for chunks (FIRST_CHUNK tokens, then CHUNK at a time),
each continuing from the prompt and the tokens so far. Between chunks the turn passes to whoever is next
(`strop.serve.turns`) and `gone()` is asked, so a client that left frees the engine within a chunk, and another
client waits for at most one chunk of this one's work. A json_schema request goes the same way: the engine's grammar
is brought past the tokens written so far before the next chunk (`resumed`); only an engine that cannot do that
(vLLM's) runs it whole.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

# Most answers end within the first chunk; each later one re-reads the prompt and the tokens so far (the engine
# keeps no cache between calls), which for one row costs a few percent of the chunk's decoding.
FIRST_CHUNK, CHUNK = 64, 256

Turn = Callable[[], AbstractContextManager]


def generate(sampler, prompt, n: int, params, decode: Callable[[list[int]], str], gone: Callable[[], bool],
             turn: Turn = nullcontext) -> list | None:
    """`n` samples of `prompt` (SampledSequences), or None as soon as `gone()` says the client has left.

    The first chunk is the request as it came (same seed, same tokens); a continued row is its own request, seeded
    from the request's seed, the row and the chunk; a stop string that spans two chunks, which the engine sees one
    at a time, is found here."""
    # lazy: strop.types pulls in torch, numpy, which importing this module does not need
    from strop import types
    if params.json_schema is not None and not sampler.continues_grammar:
        with turn():
            if gone():
                return None
            return list(sampler.sample(prompt=prompt, num_samples=n, sampling_params=params).result().sequences)
    total = params.max_tokens
    strings = [s for s in params.stop or () if isinstance(s, str)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    size, chunk = FIRST_CHUNK, 0
    while live := [i for i in range(n) if reasons[i] is None]:
        with turn():
            if gone():      # asked once the turn has come: the client may have left while it waited
                return None
            results = _chunk(sampler, prompt, params, tokens, live, size, chunk)
        for i, seq in results:
            since = len(tokens[i])
            tokens[i] += seq.tokens
            logprobs[i] += seq.logprobs
            cut = spanning_stop(tokens[i], since, strings, decode) if strings and since else None
            if cut is not None:
                del tokens[i][cut:], logprobs[i][cut:]
                reasons[i] = "stop"
            elif seq.stop_reason == "stop" or len(tokens[i]) >= total:
                reasons[i] = seq.stop_reason
        size, chunk = CHUNK, chunk + 1
    return [types.SampledSequence(stop_reason=r, tokens=t, logprobs=lp) for r, t, lp in zip(reasons, tokens, logprobs)]


def _chunk(sampler, prompt, params, tokens: list[list[int]], live: list[int], size: int, chunk: int) -> list:
    """(row, SampledSequence of its next `size` tokens at most) for each live row."""
    # lazy: strop.types pulls in torch, numpy, which importing this module does not need
    from strop import types
    total = params.max_tokens
    if chunk == 0:
        first = replace(params, max_tokens=min(size, total))
        return list(zip(live, sampler.sample(prompt=prompt, num_samples=len(live),
                                             sampling_params=first).result().sequences))
    # every row submitted before any is read: the engine runs them as one batch
    futures = [(i, sampler.sample(prompt=prompt.append(types.EncodedTextChunk(tokens=tokens[i])), num_samples=1,
                                  sampling_params=replace(params, max_tokens=min(size, total - len(tokens[i])),
                                                          seed=_chunk_seed(params.seed, i, chunk)),
                                  resumed=len(tokens[i])))
               for i in live]
    return [(i, future.result().sequences[0]) for i, future in futures]


def _chunk_seed(seed: int | None, row: int, chunk: int) -> int | None:
    return None if seed is None else (seed * 1_000_003 + (row + 1) * 7_919 + chunk * 104_729) % (2**63 - 1)


def spanning_stop(tokens: list[int], since: int, stops: list[str], decode) -> int | None:
    """The length at which `tokens` first hold a stop string begun before `since` (in an earlier chunk), or None."""
    start = max(0, since - max(len(s) for s in stops) - 2)   # a token is at least one character
    if not any(s in decode(tokens[start:]) for s in stops):
        return None
    return next((end for end in range(since + 1, len(tokens) + 1)
                 if any(s in decode(tokens[start:end]) for s in stops)), None)
