"""A Tinker sampling request served a chunk at a time, so that keys sharing `strop serve-tinker` take turns.

    chunks = Chunks(service, sampler, prompt, num_samples, params, max_tokens)
    chunks.finish_with = lambda response, client: ...       # the answer's bytes, once every sample has ended
    service.submit(session, "Sample", chunks.turn, sample={...}, tokens=..., turn_tokens=chunks.turn_tokens())
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from strop.serve.generation import spanning_stop
from strop.tinker_wire.records import Continue
from strop.tinker_wire.service import TinkerService
from strop.types import ModelInput, SampledSequence, SampleResponse, SamplingParams


class Chunks:
    """One sampling request served a chunk at a time: each turn samples at most
    `sample_batch_tokens` tokens over the request's unfinished samples, then the request goes behind the other keys'
    waiting requests. Each sample keeps its own random generator from chunk to chunk, so a seeded request draws the
    tokens it would draw whole; a stop string that spans two chunks is found here. An engine that cannot continue a
    sample's draws (vLLM, Ray replicas) runs the request whole, as one turn."""

    SMALLEST = 16                      # tokens a chunk samples at least, however many samples share the budget

    def __init__(self, service: TinkerService, sampler, prompt: list[int], num: int, params: SamplingParams,
                 max_tokens: int):
        self.service, self.sampler, self.prompt, self.params, self.total = service, sampler, prompt, params, max_tokens
        self.tokens: list[list[int]] = [[] for _ in range(num)]
        self.logprobs: list[list[float]] = [[] for _ in range(num)]
        self.reasons: list[str | None] = [None] * num
        self.client = None             # one request, one set of weights (an inflight client's may change)
        self.generators = None
        self.finish_with = None        # (SampleResponse, client) -> the answer's bytes
        stop = params.stop
        self.strings = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]

    def _live(self) -> list[int]:
        return [i for i, reason in enumerate(self.reasons) if reason is None]

    def _size(self) -> int:
        if self.client is not None and not self.client.continues_samples:
            return self.total
        return max(self.SMALLEST, self.service.sample_batch_tokens // max(1, len(self._live())))

    def turn_tokens(self) -> int:
        live = self._live()
        return sum(min(self._size(), self.total - len(self.tokens[i])) for i in live)

    def turn(self):
        """Queue this turn's samples on the engine; returns the finish that reads them."""
        import torch  # lazy, as the engine is: the server's HTTP side never needs it

        from strop.engine.sampler import row_seed  # lazy: it imports transformers
        if self.client is None:
            self.client = self.sampler.client
        client, live, size = self.client, self._live(), self._size()
        if not client.continues_samples:
            pending = client.sample(prompt=ModelInput.from_ints(self.prompt), num_samples=len(live),
                                    sampling_params=self.params)
            return lambda: self._merge(live, pending.result().sequences)
        if self.generators is None:    # what the engine would seed each sample with
            base = self.params.seed if self.params.seed is not None else secrets.randbits(62)
            self.generators = [torch.Generator().manual_seed(row_seed(base, i)) for i in range(len(self.tokens))]
        if all(not self.tokens[i] for i in live):      # the first chunk: one request shares the prompt
            first = replace(self.params, max_tokens=min(size, self.total))
            pending = client.sample(prompt=ModelInput.from_ints(self.prompt), num_samples=len(live),
                                    sampling_params=first, generators=[self.generators[i] for i in live])
            return lambda: self._merge(live, pending.result().sequences)
        futures = [client.sample(prompt=ModelInput.from_ints(self.prompt + self.tokens[i]), num_samples=1,
                                 sampling_params=replace(self.params, max_tokens=min(size, self.total - len(self.tokens[i]))),
                                 generators=[self.generators[i]]) for i in live]
        return lambda: self._merge(live, [future.result().sequences[0] for future in futures])

    def _merge(self, live: list[int], sequences: list):
        decode = self.client.get_tokenizer().decode if self.strings else None
        for i, seq in zip(live, sequences):
            since = len(self.tokens[i])
            self.tokens[i] += seq.tokens
            self.logprobs[i] += seq.logprobs
            cut = spanning_stop(self.tokens[i], since, self.strings, decode) if self.strings and since else None
            if cut is not None:
                del self.tokens[i][cut:], self.logprobs[i][cut:]
                self.reasons[i] = "stop"
            elif seq.stop_reason == "stop" or len(self.tokens[i]) >= self.total:
                self.reasons[i] = seq.stop_reason
        if self._live():
            left = sum(self.total - len(self.tokens[i]) for i in self._live())
            return Continue(self.turn, tokens=left, turn_tokens=self.turn_tokens())
        response = SampleResponse(sequences=[SampledSequence(stop_reason=r, tokens=t, logprobs=lp)
                                             for r, t, lp in zip(self.reasons, self.tokens, self.logprobs)])
        return self.finish_with(response, self.client)
