"""The tinker routes of sampling: make a sampling client (of a base model or a checkpoint), describe it, and
sample (`asample`: a request checked against the server's bounds, then served a chunk at a time by
`strop.tinker_wire.sampling.Chunks`, its answer written as the SDK's SampleResponse protobuf)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from starlette.responses import JSONResponse

from strop.client import MAX_TOPK
from strop.errors import StropError
from strop.tinker_wire import codec
from strop.tinker_wire.codec import WireError
from strop.tinker_wire.limits import (MAX_NEW_TOKENS, MAX_SAMPLED_TOKENS, MAX_TOPK_ENTRIES, prompt_tokens, remember,
                                      stop_sequences)
from strop.tinker_wire.sampling import Chunks
from strop.tinker_wire.service import MAX_SAMPLES, TinkerService
from strop.tinker_wire.web import WireState, finished, future_reply, read_model
from strop.types import ModelInput, SamplingParams


@dataclass
class SamplePlan:
    """A sampling request as checked: what to sample, and which logprobs its answer carries."""
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    want_prompt: bool
    topk_prompt: int
    topk_sample: int
    last_n: int | None

    def finish(self, response, client) -> bytes:
        """The answer's bytes once every sample has ended: the samples, with the logprobs the request asked for."""
        prompt, last_n = self.prompt, self.last_n
        lps = prompt_topk = sample_topk = None
        if self.want_prompt:
            lps = client.compute_logprobs(ModelInput.from_ints(prompt)).result()
            if last_n is not None:
                lps = [None] * (len(lps) - last_n) + list(lps[-last_n:])
        if self.topk_prompt:
            prompt_topk = client.compute_topk_logprobs_many([ModelInput.from_ints(prompt)],
                                                            self.topk_prompt).result()[0]
            if last_n is not None:
                prompt_topk = [None] * (len(prompt_topk) - last_n) + list(prompt_topk[-last_n:])
        if self.topk_sample:         # each sampled token's position, read back with the prompt before it
            rows = client.compute_topk_logprobs_many(
                [ModelInput.from_ints(prompt + list(seq.tokens)) for seq in response.sequences],
                self.topk_sample).result()
            sample_topk = [row[len(prompt):len(prompt) + len(seq.tokens)]
                           for row, seq in zip(rows, response.sequences)]
        return codec.write_sample_response(response, lps, prompt_topk=prompt_topk, sample_topk=sample_topk)


def plan_sample(service: TinkerService, sampler, req) -> SamplePlan:
    """Check a SampleRequest against this server's bounds, in the order the client is told of them."""
    if req.prompt_alt_tokens_k:
        raise WireError("prompt_alt_tokens_k is not supported by this server yet; leave it at 0")
    topk_prompt, topk_sample = req.topk_prompt_logprobs or 0, req.topk_sample_logprobs or 0
    for name, value in (("topk_prompt_logprobs", topk_prompt), ("topk_sample_logprobs", topk_sample)):
        if not 0 <= value <= MAX_TOPK:
            raise WireError(f"{name} must be 0..{MAX_TOPK}, got {value}")
    if req.target_prompt_logprobs is not None or req.record_stability_info:
        raise WireError("target_prompt_logprobs and record_stability_info are not supported by this server yet")
    if not 1 <= req.num_samples <= MAX_SAMPLES:
        raise WireError(f"num_samples must be 1..{MAX_SAMPLES}, got {req.num_samples}")
    info = service.model_info(sampler.base_model)
    prompt = prompt_tokens(req.prompt, info["vocab_size"])
    if not prompt:
        raise WireError("the prompt is empty; send at least one token")
    room = info["context"] - len(prompt)
    if room < 1:
        raise WireError(f"the prompt has {len(prompt)} tokens; the model's context is {info['context']}")
    sp = req.sampling_params
    if not (np.isfinite(sp.temperature) and sp.temperature >= 0 and np.isfinite(sp.top_p)):
        raise WireError("temperature must be a finite number >= 0 and top_p a number in (0, 1]")
    max_tokens = min(sp.max_tokens if sp.max_tokens is not None else MAX_NEW_TOKENS, room)
    if sp.max_tokens is not None and not 1 <= sp.max_tokens <= MAX_NEW_TOKENS:
        raise WireError(f"max_tokens must be 1..{MAX_NEW_TOKENS}, got {sp.max_tokens}")
    if sp.max_tokens is None:
        max_tokens = min(max_tokens, MAX_SAMPLED_TOKENS // req.num_samples)
    elif req.num_samples * max_tokens > MAX_SAMPLED_TOKENS:
        raise WireError(f"num_samples x max_tokens = {req.num_samples * max_tokens} is over this server's "
                        f"{MAX_SAMPLED_TOKENS} per request; send fewer samples per request")
    entries = len(prompt) * topk_prompt + req.num_samples * max_tokens * topk_sample
    if entries > MAX_TOPK_ENTRIES:
        raise WireError(f"top-k logprobs for {entries:,} (token, position) pairs is over this server's "
                        f"{MAX_TOPK_ENTRIES:,} per request; ask for a smaller k or fewer tokens")
    last_n = req.prompt_logprobs_last_n
    if last_n is not None and not (req.prompt_logprobs and 1 <= last_n <= len(prompt) - 1):
        raise WireError("prompt_logprobs_last_n needs prompt_logprobs and must be 1..len(prompt) - 1")
    try:
        params = SamplingParams(max_tokens=max_tokens, seed=sp.seed, temperature=sp.temperature,
                                top_k=sp.top_k, top_p=sp.top_p, stop=stop_sequences(sp.stop, info["vocab_size"]))
    except StropError as exc:
        raise WireError(str(exc)) from None
    return SamplePlan(prompt, params, max_tokens, bool(req.prompt_logprobs), topk_prompt, topk_sample, last_n)


def register_sampling_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service = state.service

    @state.route("/api/v1/create_sampling_session")
    async def create_sampling_session(request, who):
        req = await read_model(request, types.CreateSamplingSessionRequest)
        session = service.session(req.session_id, who)
        if req.model_path is not None:
            folder, info = service.store.folder(req.model_path, who, read=True)
            base = info["base_model"]
            if req.base_model is not None and req.base_model != base:
                raise WireError(f"{req.model_path} was trained on {base}, not {req.base_model}")
        elif req.base_model is not None:
            folder, base = None, req.base_model
        else:
            raise WireError("create_sampling_session needs base_model or model_path")
        await service.resolve(base)

        def run():     # on the worker: every torch computation of the server happens on that one thread
            client = _sampling_client(service, base, folder)
            return {"sampler": service.add_sampler(session, req.sampling_session_seq_id, base, req.model_path,
                                                   client).id}
        record = service.future(service.submit(session, "CreateSampler", run), who)
        await finished(service, record)
        if record.error is not None:
            raise WireError(record.error, 400 if record.category == "user" else 500)
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": record.payload["sampler"]})

    @state.route("/api/v1/samplers/{sampler_id}", methods=("GET",))
    async def get_sampler(request, who):
        sampler = service.sampler(request.path_params["sampler_id"], who)
        return JSONResponse({"sampler_id": sampler.id, "base_model": sampler.base_model,
                             "model_path": sampler.model_path})

    @state.route("/api/v1/asample")
    async def asample(request, who):
        req = await read_model(request, types.SampleRequest)
        if req.sampling_session_id is None:
            raise WireError("asample needs sampling_session_id (create a SamplingClient first)")
        sampler = service.sampler(req.sampling_session_id, who)
        if req.seq_id is not None and req.seq_id in sampler.seq_futures:
            return future_reply(sampler.seq_futures[req.seq_id][0],
                                sample_sequence_ids=sampler.seq_futures[req.seq_id][1])
        plan = plan_sample(service, sampler, req)
        session = service.session(sampler.session_id, who)
        num = req.num_samples
        chunks = Chunks(service, sampler, plan.prompt, num, plan.params, plan.max_tokens)
        chunks.finish_with = plan.finish
        future_id = service.submit(session, "Sample", chunks.turn, sample={"sampler": sampler.id},
                                   tokens=num * plan.max_tokens, turn_tokens=chunks.turn_tokens())
        ids = [f"{future_id}:{i}" for i in range(num)]
        if req.seq_id is not None:
            remember(sampler.seq_futures, req.seq_id, (future_id, ids))
        return future_reply(future_id, sample_sequence_ids=ids)


def _sampling_client(service: TinkerService, base: str, folder):
    with service.engine_lock:       # engines are made once per base model; not while another thread makes one
        return service.strop.create_sampling_client(base_model=base, model_path=str(folder) if folder else None)
