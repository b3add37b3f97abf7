"""The HTTP side of `strop serve-tinker`: the routes the unmodified `tinker` SDK calls, over a `TinkerService`.

    app = make_tinker_app(service, api_keys={"tml-..."})      # or open_mode=True: any key, quotas per address
    server = TinkerServer(app, port=0).start()                 # TINKER_BASE_URL=server.url

JSON bodies are read with the SDK's own request models (so a field the SDK sends is a field this server reads);
forward_backward arrives as protobuf, and ForwardBackwardOutput and SampleResponse results go back as protobuf,
as the SDK asks. Errors are `{"detail": message}` with a status the SDK maps to its own exception types (400
BadRequestError, 401 AuthenticationError, 404 NotFoundError, 413, 429 RateLimitError); a computation that fails
reaches the caller as the SDK's RequestFailedError with the reason.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np

from strop.client import MAX_TOPK, SamplingClient
from strop.envs.openenv_server import EnvServer
from strop.errors import StropError
from strop.models import CATALOG
from strop.tinker_wire import codec
from strop.tinker_wire.checkpoints import KINDS, check_name, iso, parse_path
from strop.tinker_wire.codec import WireError
from strop.tinker_wire.sampling import Chunks
from strop.tinker_wire.service import MAX_SAMPLES, TinkerService
from strop.tinker_wire.tenants import Tenancy, new_run_record
from strop.types import AdamParams, ModelInput, SamplingParams

MAX_BODY_BYTES = 64 << 20       # a forward_backward chunk (the SDK splits at ~5 MB of payload; zstd or not)
MAX_JSON_BYTES = 8 << 20        # any other request
MAX_DATUMS = 1024               # datums in one forward_backward request (the SDK's chunk is at most this)
LONG_POLL_S = 20.0              # retrieve_future waits this long for a result before answering try_again
BODY_TIMEOUT_S = 60.0           # a request body must arrive within this
MAX_TTL_S = 10 * 365 * 86400    # a checkpoint's longest TTL (the SDK's: 1 hour to 10 years, or never)
MAX_TOPK_ENTRIES = 1 << 22      # top-k (token, logprob) pairs in one sampling reply: 32 MB
MAX_NEW_TOKENS = 8192           # one sampling request's completion budget per sample
MAX_SAMPLED_TOKENS = 131072     # and over all its samples (num_samples x max_tokens): a request's time is bounded
MAX_REQUEST_TOKENS = 300_000    # input tokens in one forward_backward request (the SDK's ~4 MB chunks stay under)
SUPPORTED_LOSSES = {"cross_entropy": (), "importance_sampling": (), "ppo": ("clip_low_threshold", "clip_high_threshold"),
                    "cispo": ("clip_low_threshold", "clip_high_threshold"), "dro": ("beta",)}
ATTN, MLP = ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]


def client_config(sample_concurrency: int) -> dict:
    """The feature flags this server gives the SDK (tinker.types.ClientConfigResponse): API keys (no JWT
    exchange), httpx transport, one forward_backward chunk at a time, no server-side custom losses, per-request
    polling of results."""
    return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
            "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False, "fwdbwd_max_chunk_len": MAX_DATUMS,
            "fwdbwd_max_chunk_bytes_count": 4_000_000, "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False, "sample_join_sampling_session": False,
            "sample_max_concurrent_requests": sample_concurrency, "sample_enable_stuck_detection": False}


def make_tinker_app(service: TinkerService, *, api_keys: set[str] | None = None, open_mode: bool = False,
                    sample_concurrency: int = 256, long_poll_s: float = LONG_POLL_S):
    """`api_keys`: the only keys accepted (each its own owner and quota); or `open_mode`: any key, each its own
    owner, quotas per client address (`strop.tinker_wire.tenants`). One of the two is required."""
    tenancy = Tenancy(api_keys, open_mode=open_mode)
    # lazy: starlette and the SDK's types load only when a server is made
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from tinker import types
    import pydantic

    def fail(exc: WireError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    async def body_bytes(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise WireError(f"request body over {limit} bytes; send smaller requests", 413)
        body = bytearray()

        async def read():
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise WireError(f"request body over {limit} bytes; send smaller requests", 413)
        try:
            await asyncio.wait_for(read(), BODY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise WireError(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s", 408) from None
        encoding = request.headers.get("content-encoding", "").lower()
        if encoding == "zstd":
            body = bytearray(_unzstd(bytes(body), limit))
        elif encoding not in ("", "identity"):
            raise WireError(f"content-encoding {encoding[:20]!r} is not supported (zstd or none)", 415)
        return bytes(body)

    async def read_field(request: Request, name: str, example: str):
        """One field of a small JSON object body (None when absent)."""
        raw = await body_bytes(request, MAX_JSON_BYTES)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):     # RecursionError: nesting deeper than the parser goes
            data = None
        if not isinstance(data, dict):
            raise WireError(f"the body must be a JSON object such as {example}")
        return data.get(name)

    async def read_model(request: Request, model_cls):
        raw = await body_bytes(request, MAX_JSON_BYTES)
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise WireError("the body is not JSON") from None
        except RecursionError:      # was a 500 with a traceback, which the SDK retries
            raise WireError("the JSON body is nested too deeply; send the request the SDK's models describe") \
                from None
        try:
            return model_cls.model_validate(data)
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                                 for e in exc.errors()[:5])
            raise WireError(f"{model_cls.__name__}: {problems}") from None

    def route(path, methods=("POST",)):
        def wrap(handler):
            async def endpoint(request: Request):
                try:
                    return await handler(request, tenancy.owner(request.headers))
                except WireError as exc:
                    return fail(exc)
            return Route(path, endpoint, methods=list(methods))
        return wrap

    def future_reply(future_id: str, **extra) -> JSONResponse:
        return JSONResponse({"request_id": future_id, **extra})

    routes = []

    async def healthz(request: Request):
        return JSONResponse({"status": "ok"})
    routes.append(Route("/api/v1/healthz", healthz, methods=["GET"]))

    @route("/api/v1/client/config")
    async def config(request, who):
        return JSONResponse(client_config(sample_concurrency))

    @route("/api/v1/client/dynamic_config")
    async def dynamic_config(request, who):
        return JSONResponse({"refresh_interval_sec": 3600, "sample_cancel_enabled": False})

    @route("/api/v1/get_server_capabilities", methods=("GET",))
    async def capabilities(request, who):
        return JSONResponse({"supported_models": [
            {"model_name": e.model_id, "trainable": True, "sampleable": True} for e in CATALOG]})

    @route("/api/v1/telemetry")
    async def telemetry(request, who):
        await body_bytes(request, MAX_JSON_BYTES)     # read and dropped: this server sends nothing anywhere
        return JSONResponse({"status": "accepted"})

    # ---- sessions ----
    @route("/api/v1/create_session")
    async def create_session(request, who):
        req = await read_model(request, types.CreateSessionRequest)
        holder = tenancy.quota_holder(who, request.client.host if request.client else None)
        session = service.create_session(who, req.tags, req.user_metadata, _project(req.project_id), holder=holder)
        return JSONResponse({"type": "create_session", "session_id": session.id})

    @route("/api/v1/session_heartbeat")
    async def heartbeat(request, who):
        req = await read_model(request, types.SessionHeartbeatRequest)
        service.session(req.session_id, who)
        return JSONResponse({"type": "session_heartbeat"})

    @route("/api/v1/sessions/{session_id}/finish")
    async def finish(request, who):
        raw = await body_bytes(request, MAX_JSON_BYTES)
        try:
            reason = str((json.loads(raw or b"{}").get("reason") or {}).get("type", "success"))[:40]
        except (ValueError, AttributeError, RecursionError):
            reason = "success"
        service.finish_session(request.path_params["session_id"], who, reason)
        return JSONResponse({})

    @route("/api/v1/sessions/{session_id}", methods=("GET",))
    async def get_session(request, who):
        session = service.session(request.path_params["session_id"], who, live=False)
        return JSONResponse({"training_run_ids": sorted(session.models), "sampler_ids": sorted(session.samplers),
                             "user_metadata": _str_dict(session.user_metadata)})

    @route("/api/v1/sessions/{session_id}/project", methods=("PUT",))
    async def assign_project(request, who):
        project = _project(await read_field(request, "project_id", '{"project_id": "..."}'))
        if project is None:
            raise WireError("project_id is missing; a session cannot be moved out of a project")
        session = service.session(request.path_params["session_id"], who, live=False)
        session.project_id = project
        for run_id in sorted(session.models):         # its training runs move with it
            try:
                info = service.store.run_info(run_id, who)
            except WireError:
                continue                              # a model whose creation failed has no run
            service.store.record_run(run_id, {**info, "project_id": project})
        return JSONResponse({})

    @route("/api/v1/sessions", methods=("GET",))
    async def list_sessions(request, who):
        with service.lock:
            mine = sorted((s for s in service.sessions.values() if s.owner == who), key=lambda s: -s.created)
        shown, cursor = page(request, [s.id for s in mine])
        return JSONResponse({"sessions": shown, "cursor": cursor})

    @route("/api/v1/cancel_future")
    async def cancel(request, who):
        await body_bytes(request, MAX_JSON_BYTES)
        return JSONResponse({})

    # ---- futures ----
    @route("/api/v1/retrieve_future")
    async def retrieve(request, who):
        req = await read_model(request, types.FutureRetrieveRequest)
        record = service.future(req.request_id, who)
        if not record.done:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            service.add_waiter(record, loop, waiter)
            try:
                await asyncio.wait_for(waiter, long_poll_s)
            except asyncio.TimeoutError:   # not done yet: the SDK asks again at once (408 is its quiet try_again)
                return JSONResponse({"type": "try_again", "request_id": record.id, "queue_state": "active"},
                                    status_code=408)
        record.read_at = time.time()
        if record.error is not None:
            return JSONResponse({"error": record.error, "category": record.category})
        if isinstance(record.payload, bytes):
            return Response(record.payload, media_type="application/x-protobuf")
        return JSONResponse(record.payload)

    # ---- training models ----
    @route("/api/v1/create_model")
    async def create_model(request, who):
        req = await read_model(request, types.CreateModelRequest)
        session = service.session(req.session_id, who)
        _adam_only(req.optimizer_config)
        lora = req.lora_config or types.LoraConfig(rank=32)
        if not 1 <= lora.rank <= 256:
            raise WireError(f"LoRA rank {lora.rank} is outside 1..256")
        targets = (ATTN if lora.train_attn else []) + (MLP if lora.train_mlp else [])
        if not targets:
            raise WireError("this server adapts attention and MLP projections (train_attn, train_mlp); "
                            "train_unembed alone is not supported")
        await service.resolve(req.base_model)   # an unknown model is refused now, not in the future; off the loop
        model = service.add_model(session, req.model_seq_id, req.base_model, lora.rank,
                                  {"train_attn": lora.train_attn, "train_mlp": lora.train_mlp,
                                   "train_unembed": lora.train_unembed, "seed": lora.seed})

        def run():
            try:
                model.client = service.strop.create_lora_training_client(
                    base_model=req.base_model, rank=lora.rank, seed=lora.seed,
                    target_modules=None if lora.train_attn and lora.train_mlp else targets)
            except BaseException:
                service.models.pop(model.id, None)
                session.models.discard(model.id)
                raise
            service.store.record_run(model.id, new_run_record(
                owner=who, base_model=req.base_model, lora_rank=lora.rank, lora=model.lora,
                project_id=session.project_id, user_metadata=_str_dict(req.user_metadata)))
            return {"type": "create_model", "model_id": model.id}
        return future_reply(service.submit(session, "CreateModel", run), model_id=model.id)

    @route("/api/v1/get_info")
    async def get_info(request, who):
        req = await read_model(request, types.GetInfoRequest)
        model = service.model(req.model_id, who)
        info = service.model_info(model.base_model)
        return JSONResponse({"type": "get_info", "model_id": model.id, "is_lora": True, "lora_rank": model.rank,
                             "model_name": model.base_model,
                             "model_data": {"arch": info["arch"], "model_name": model.base_model,
                                            "tokenizer_id": info["folder"]}})

    @route("/api/v1/forward_backward")
    async def forward_backward(request, who):
        if "protobuf" not in request.headers.get("content-type", ""):
            raise WireError("forward_backward takes a protobuf body (Content-Type: application/x-protobuf), as the "
                            "tinker SDK sends it", 415)
        raw = await body_bytes(request, MAX_BODY_BYTES)
        model_id = _peek_model_id(raw)
        model = service.model(model_id, who)
        info = service.model_info(model.base_model)
        _, seq_id, data, loss_fn, config, forward_only = codec.read_forward_backward(
            raw, vocab_size=info["vocab_size"], max_tokens=info["context"], max_datums=MAX_DATUMS,
            check_loss=_check_loss)
        total = sum(d.model_input.length for d in data)
        if total > MAX_REQUEST_TOKENS:
            raise WireError(f"{total} tokens in one forward_backward request; this server takes at most "
                            f"{MAX_REQUEST_TOKENS} (split the batch into several calls)", 413)
        if seq_id and seq_id in model.seq_futures:
            return future_reply(model.seq_futures[seq_id], model_id=model.id)
        session = service.session(model.session_id, who)

        def run():
            client = _trained(model)
            call = client.forward if forward_only else client.forward_backward
            output = call(data, loss_fn=loss_fn, loss_fn_config=config or None).result()
            return codec.write_forward_backward_output(output)
        future_id = service.submit(session, "Forward" if forward_only else "ForwardBackward", run, cost=len(raw))
        _remember(model.seq_futures, seq_id, future_id)
        return future_reply(future_id, model_id=model.id)

    @route("/api/v1/optim_step")
    async def optim_step(request, who):
        req = await read_model(request, types.OptimStepRequest)
        model = service.model(req.model_id, who)
        if not isinstance(req.optim_params, types.AdamParams):
            raise WireError("this server's optimizer is AdamW: send AdamParams")
        p = req.optim_params
        for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(p, name)
            if not np.isfinite(value) or value < 0:
                raise WireError(f"AdamParams.{name} must be a finite number >= 0, got {value}")
        if not (p.beta1 < 1 and p.beta2 < 1):
            raise WireError("AdamParams beta1 and beta2 must be below 1")
        if req.seq_id and req.seq_id in model.seq_futures:
            return future_reply(model.seq_futures[req.seq_id], model_id=model.id)
        session = service.session(model.session_id, who)

        def run():
            adam = AdamParams(learning_rate=p.learning_rate, beta1=p.beta1, beta2=p.beta2, eps=p.eps,
                              weight_decay=p.weight_decay, grad_clip_norm=p.grad_clip_norm)
            metrics = _trained(model).optim_step(adam).result().metrics
            return {"metrics": {k: float(v) for k, v in metrics.items()}}
        future_id = service.submit(session, "OptimStep", run)
        if req.seq_id:
            _remember(model.seq_futures, req.seq_id, future_id)
        return future_reply(future_id, model_id=model.id)

    # ---- weights ----
    @route("/api/v1/save_weights")
    async def save_weights(request, who):
        req = await read_model(request, types.SaveWeightsRequest)
        model = service.model(req.model_id, who)
        name = check_name(req.path) if req.path is not None else f"state-{int(time.time() * 1000)}"
        path = service.store.path_for(model.id, "weights", name)
        folder, _ = service.store.folder(path, who, must_exist=False)
        if folder.exists() and not req.overwrite:
            raise WireError(f"checkpoint {path} exists; pick another name or pass overwrite=True")
        session = service.session(model.session_id, who)

        def run():
            _trained(model).trainer.save_state(folder)
            service.store.finish(path, who, _str_dict(req.user_metadata), req.ttl_seconds)
            service.register(path, who)
            return {"type": "save_weights", "path": path}
        return future_reply(service.submit(session, "SaveWeights", run), model_id=model.id)

    @route("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request, who):
        req = await read_model(request, types.SaveWeightsForSamplerRequest)
        model = service.model(req.model_id, who)
        session = service.session(model.session_id, who)
        if req.path is not None:
            path = service.store.path_for(model.id, "sampler_weights", check_name(req.path))
            folder, _ = service.store.folder(path, who, must_exist=False)

            def run():
                _trained(model).trainer.save_weights(folder)
                service.store.finish(path, who, _str_dict(req.user_metadata), req.ttl_seconds)
                service.register(path, who)
                return {"type": "save_weights_for_sampler", "path": path}
        else:
            inflight = req.kind == "inflight"   # the model's inflight clients, older ones too, move to these weights

            def run():
                client = _trained(model)
                snapshot = client.trainer.adapter_weights()
                with service.engine_lock:
                    sampling = SamplingClient(client.backend, model.base_model, adapter=snapshot)
                sampler = service.add_sampler(session, req.sampling_session_seq_id, model.base_model, None, sampling,
                                              inflight_of=model.id if inflight else None)
                if inflight:
                    service.publish_inflight(model.id, sampling)
                return {"type": "save_weights_for_sampler", "path": None, "sampling_session_id": sampler.id}
        return future_reply(service.submit(session, "SaveWeightsForSampler", run), model_id=model.id)

    @route("/api/v1/load_weights")
    async def load_weights(request, who):
        req = await read_model(request, types.LoadWeightsRequest)
        folder, run_info = service.store.folder(req.path, who, read=True)
        _, kind, _ = parse_path(req.path)
        if req.optimizer and kind != "weights":
            raise WireError(f"{req.path} is a sampler checkpoint (weights only); load a save_state checkpoint "
                            "(tinker://.../weights/...) to restore the optimizer")
        if req.model_id is not None:
            model = service.model(req.model_id, who)
            if model.base_model != run_info["base_model"] or model.rank != run_info["lora_rank"]:
                raise WireError(f"{req.path} was trained on {run_info['base_model']} with LoRA rank "
                                f"{run_info['lora_rank']}; this model is {model.base_model} rank {model.rank}")
            session = service.session(model.session_id, who)
            created = False
        else:
            if req.session_id is None or req.model_seq_id is None:
                raise WireError("load_weights needs model_id, or session_id and model_seq_id")
            session = service.session(req.session_id, who)
            base = req.base_model or run_info["base_model"]
            if base != run_info["base_model"]:
                raise WireError(f"{req.path} was trained on {run_info['base_model']}, not {base}")
            lora = {k: run_info.get(k) for k in ("train_attn", "train_mlp", "train_unembed", "seed")}
            model = service.add_model(session, req.model_seq_id, base, int(run_info["lora_rank"]), lora)
            created = True

        def run():
            if created:
                targets = (ATTN if lora["train_attn"] else []) + (MLP if lora["train_mlp"] else [])
                try:
                    model.client = service.strop.create_lora_training_client(
                        base_model=model.base_model, rank=model.rank, seed=lora.get("seed"),
                        target_modules=None if lora["train_attn"] and lora["train_mlp"] else targets)
                except BaseException:
                    service.models.pop(model.id, None)
                    session.models.discard(model.id)
                    raise
                # weights from the checkpoint, identity from this request: the loaded run's record (its owner,
                # its store run) is never copied, so this model's saves are registered as a run of the loader's
                service.store.record_run(model.id, new_run_record(
                    owner=who, base_model=model.base_model, lora_rank=model.rank, lora=lora,
                    project_id=session.project_id, loaded_from=req.path))
            _trained(model).trainer.load_state(folder, with_optimizer=bool(req.optimizer))
            return {"type": "load_weights", "path": req.path, "model_id": model.id}
        return future_reply(service.submit(session, "LoadWeights", run), model_id=model.id)

    @route("/api/v1/weights_info")
    async def weights_info(request, who):
        path = await read_field(request, "tinker_path", '{"tinker_path": "tinker://..."}')
        _, info = service.store.folder(path, who, read=True)
        return JSONResponse({"base_model": info["base_model"], "is_lora": True, "lora_rank": info["lora_rank"],
                             "train_mlp": info.get("train_mlp"), "train_attn": info.get("train_attn"),
                             "train_unembed": info.get("train_unembed")})

    # ---- sampling ----
    @route("/api/v1/create_sampling_session")
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
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        service.add_waiter(record, loop, waiter)
        await waiter
        record.read_at = time.time()
        if record.error is not None:
            raise WireError(record.error, 400 if record.category == "user" else 500)
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": record.payload["sampler"]})

    @route("/api/v1/samplers/{sampler_id}", methods=("GET",))
    async def get_sampler(request, who):
        sampler = service.sampler(request.path_params["sampler_id"], who)
        return JSONResponse({"sampler_id": sampler.id, "base_model": sampler.base_model,
                             "model_path": sampler.model_path})

    @route("/api/v1/asample")
    async def asample(request, who):
        req = await read_model(request, types.SampleRequest)
        if req.sampling_session_id is None:
            raise WireError("asample needs sampling_session_id (create a SamplingClient first)")
        sampler = service.sampler(req.sampling_session_id, who)
        if req.seq_id is not None and req.seq_id in sampler.seq_futures:
            return future_reply(sampler.seq_futures[req.seq_id][0],
                                sample_sequence_ids=sampler.seq_futures[req.seq_id][1])
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
        prompt = _prompt_tokens(req.prompt, info["vocab_size"])
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
                                    top_k=sp.top_k, top_p=sp.top_p, stop=_stop(sp.stop, info["vocab_size"]))
        except StropError as exc:
            raise WireError(str(exc)) from None
        session = service.session(sampler.session_id, who)
        want_prompt = bool(req.prompt_logprobs)
        num = req.num_samples

        chunks = Chunks(service, sampler, prompt, num, params, max_tokens)

        def finish_with(response, client) -> bytes:
            lps = prompt_topk = sample_topk = None
            if want_prompt:
                lps = client.compute_logprobs(ModelInput.from_ints(prompt)).result()
                if last_n is not None:
                    lps = [None] * (len(lps) - last_n) + list(lps[-last_n:])
            if topk_prompt:
                prompt_topk = client.compute_topk_logprobs_many([ModelInput.from_ints(prompt)],
                                                                topk_prompt).result()[0]
                if last_n is not None:
                    prompt_topk = [None] * (len(prompt_topk) - last_n) + list(prompt_topk[-last_n:])
            if topk_sample:         # each sampled token's position, read back with the prompt before it
                rows = client.compute_topk_logprobs_many(
                    [ModelInput.from_ints(prompt + list(seq.tokens)) for seq in response.sequences],
                    topk_sample).result()
                sample_topk = [row[len(prompt):len(prompt) + len(seq.tokens)]
                               for row, seq in zip(rows, response.sequences)]
            return codec.write_sample_response(response, lps, prompt_topk=prompt_topk, sample_topk=sample_topk)
        chunks.finish_with = finish_with
        future_id = service.submit(session, "Sample", chunks.turn, sample={"sampler": sampler.id},
                                   tokens=num * max_tokens, turn_tokens=chunks.turn_tokens())
        ids = [f"{future_id}:{i}" for i in range(num)]
        if req.seq_id is not None:
            _remember(sampler.seq_futures, req.seq_id, (future_id, ids))
        return future_reply(future_id, sample_sequence_ids=ids)

    # ---- the REST client's listings ----
    def run_entry(run_id: str, info: dict, viewer: str | None = None) -> dict:
        checkpoints = service.store.checkpoints(run_id, info["owner"])
        if viewer is not None and viewer != info["owner"]:     # another key sees what was published
            checkpoints = [c for c in checkpoints if c["public"]]
        last = {kind: [c for c in checkpoints if c["checkpoint_type"] == kind] for kind in KINDS.values()}
        with service.lock:
            live = service.models.get(run_id)
        return {"training_run_id": run_id, "base_model": info["base_model"], "model_owner": info["owner"],
                "is_lora": True, "lora_rank": info.get("lora_rank"), "corrupted": False,
                "last_request_time": iso(live.last_request if live else info.get("created", 0)),
                "last_checkpoint": last["training"][-1] if last["training"] else None,
                "last_sampler_checkpoint": last["sampler"][-1] if last["sampler"] else None,
                "user_metadata": info.get("user_metadata")}

    def page(request, items: list) -> tuple[list, dict]:
        try:
            limit = min(max(int(request.query_params.get("limit", 20)), 1), 1000)
            offset = max(int(request.query_params.get("offset", 0)), 0)
        except ValueError:
            raise WireError("limit and offset must be integers") from None
        return items[offset:offset + limit], {"offset": offset, "limit": limit, "total_count": len(items)}

    @route("/api/v1/training_runs", methods=("GET",))
    async def training_runs(request, who):
        scope = request.query_params.get("access_scope", "owned")
        if scope not in ("owned", "accessible"):
            raise WireError(f"access_scope is 'owned' or 'accessible', not {scope[:40]!r}")
        project = request.query_params.get("project_id")

        def read():     # every run folder is read: on a thread, so other tenants' requests go on meanwhile
            found = service.store.runs(who, accessible=scope == "accessible")
            return [run_entry(run_id, info, who) for run_id, info in found
                    if project is None or info.get("project_id") == project]
        runs = await asyncio.to_thread(read)
        runs.sort(key=lambda r: r["last_request_time"], reverse=True)
        shown, cursor = page(request, runs)
        return JSONResponse({"training_runs": shown, "cursor": cursor})

    @route("/api/v1/training_runs/{run_id}", methods=("GET",))
    async def training_run(request, who):
        run_id = request.path_params["run_id"]
        return JSONResponse(run_entry(run_id, service.store.run_info(run_id, who)))

    @route("/api/v1/training_runs/{run_id}/checkpoints", methods=("GET",))
    async def run_checkpoints(request, who):
        return JSONResponse({"checkpoints": service.store.checkpoints(request.path_params["run_id"], who)})

    def checkpoint_path(request) -> str:
        p = request.path_params
        return f"tinker://{p['run_id']}/{p['kind']}/{p['name']}"

    @route("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish", methods=("POST",))
    async def publish(request, who):
        path = checkpoint_path(request)
        folder, _ = service.store.folder(path, who)
        if service.store.meta(folder).get("public"):
            raise WireError(f"{path} is public already")     # 400: the SDK retries a 409 for minutes
        service.store.update(path, who, public=True)      # other keys may now sample and load it, not change it
        return JSONResponse({})

    @route("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/publish", methods=("DELETE",))
    async def unpublish(request, who):
        path = checkpoint_path(request)
        folder, _ = service.store.folder(path, who)
        if not service.store.meta(folder).get("public"):
            raise WireError(f"{path} is not public")
        service.store.update(path, who, public=False)
        return JSONResponse({})

    @route("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl", methods=("PUT",))
    async def set_ttl(request, who):
        ttl = await read_field(request, "ttl_seconds", '{"ttl_seconds": 7200} (null: never expires)')
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL_S):
            raise WireError(f"ttl_seconds must be 1..{MAX_TTL_S} (10 years) or null (never expires), got "
                            f"{str(ttl)[:40]}")
        service.store.update(checkpoint_path(request), who, expires_at=time.time() + ttl if ttl else None)
        return JSONResponse({})

    @route("/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id:path}", methods=("DELETE",))
    async def delete_checkpoint(request, who):
        p = request.path_params
        service.store.delete(f"tinker://{p['run_id']}/{p['checkpoint_id']}", who)
        return JSONResponse({})

    @route("/api/v1/checkpoints", methods=("GET",))
    async def all_checkpoints(request, who):
        found = await asyncio.to_thread(        # reads every run folder: off the event loop
            lambda: [c for run_id, _ in service.store.runs(who) for c in service.store.checkpoints(run_id, who)])
        found.sort(key=lambda c: c["time"], reverse=True)
        shown, cursor = page(request, found)
        return JSONResponse({"checkpoints": shown, "cursor": cursor})

    for handler in (config, dynamic_config, capabilities, telemetry, create_session, heartbeat, finish, get_session,
                    list_sessions,
                    cancel, retrieve, create_model, get_info, forward_backward, optim_step, save_weights,
                    save_for_sampler, load_weights, weights_info, create_sampling_session, get_sampler, asample,
                    training_runs, training_run, run_checkpoints, publish, unpublish, set_ttl, delete_checkpoint,
                    all_checkpoints, assign_project):
        routes.append(handler)

    async def not_found(request, exc):
        return JSONResponse({"detail": f"{request.method} {request.url.path[:200]} is not part of the tinker API "
                                       "this server speaks"}, status_code=getattr(exc, "status_code", 404))
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.state.service = service
    return app


def _unzstd(body: bytes, limit: int) -> bytes:
    import zstandard  # lazy: only a compressed body needs it (the tinker SDK depends on it)
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise WireError(f"the zstd body does not decompress ({exc})") from None
    if len(out) > limit:
        raise WireError(f"the decompressed body is over {limit} bytes", 413)
    return out


def _remember(seen: dict, seq_id: int, value) -> None:
    """Note the future a request's seq_id got (a re-sent request gets it again), keeping the newest 1024."""
    seen[seq_id] = value
    while len(seen) > 1024:
        del seen[next(iter(seen))]


def _peek_model_id(raw: bytes) -> str:
    pb = codec.proto()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(raw)
    except Exception as exc:
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest protobuf ({exc})") from None
    return msg.model_id


def _check_loss(loss_fn: str, config: dict) -> None:
    if loss_fn not in SUPPORTED_LOSSES:
        raise WireError(f"loss_fn {loss_fn[:40]!r} is not supported by this server; it has "
                        f"{', '.join(SUPPORTED_LOSSES)} (forward_backward_custom works too)")
    unknown = [k for k in config if k not in SUPPORTED_LOSSES[loss_fn]]
    if unknown:
        allowed = ", ".join(SUPPORTED_LOSSES[loss_fn]) or "none"
        raise WireError(f"loss_fn_config for {loss_fn!r}: unsupported key {unknown[0][:40]!r} (it takes {allowed})")
    for key, value in config.items():
        if not isinstance(value, float) or not np.isfinite(value) or value < 0:
            raise WireError(f"loss_fn_config[{key!r}] must be a finite number >= 0")
    if "clip_low_threshold" in config and "clip_high_threshold" in config and \
            config["clip_low_threshold"] > config["clip_high_threshold"]:
        raise WireError("loss_fn_config: clip_low_threshold is above clip_high_threshold")


def _adam_only(optimizer_config) -> None:
    kind = getattr(optimizer_config, "type", "adamw")
    if kind != "adamw":
        raise WireError(f"optimizer {str(kind)[:30]!r} is not supported by this server; it trains with AdamW")


def _trained(model):
    if model.client is None:
        raise WireError(f"model {model.id} was not created (its create_model request failed)")
    return model.client


def _project(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise WireError(f"project_id must be a string of 1-128 characters, got {str(value)[:40]!r}")
    return value


def _str_dict(value) -> dict | None:
    if not value:
        return None
    return {str(k)[:100]: str(v)[:1000] for k, v in list(value.items())[:64]}


def _prompt_tokens(model_input, vocab_size: int) -> list[int]:
    tokens: list[int] = []
    for chunk in model_input.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise WireError("only text chunks (EncodedTextChunk) are supported; this server's models read no images")
        tokens.extend(int(t) for t in chunk.tokens)
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise WireError(f"prompt token id {bad[0]} is outside the model's vocabulary (0..{vocab_size - 1})")
    return tokens


def _stop(stop, vocab_size: int):
    if stop is None or isinstance(stop, str):
        return stop
    stop = list(stop)
    if len(stop) > 64:
        raise WireError("at most 64 stop sequences")
    if all(isinstance(s, int) for s in stop):
        if any(not 0 <= s < vocab_size for s in stop):
            raise WireError("a stop token id is outside the model's vocabulary")
        return stop
    if all(isinstance(s, str) for s in stop):
        if any(len(s) > 1000 for s in stop):
            raise WireError("a stop string is over 1000 characters")
        return stop
    raise WireError("stop must be strings or token ids, not a mix")


def _sampling_client(service: TinkerService, base: str, folder):
    with service.engine_lock:       # engines are made once per base model; not while another thread makes one
        return service.strop.create_sampling_client(base_model=base, model_path=str(folder) if folder else None)


class TinkerServer(EnvServer):
    """uvicorn in a background thread, with the same bounds on slow and oversized requests as the environment
    server (`strop.envs.openenv_server.EnvServer`)."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8000, read_timeout_s: float = 30.0):
        super().__init__(app, host=host, port=port, max_message_bytes=MAX_BODY_BYTES, read_timeout_s=read_timeout_s,
                         max_connections=1024)

    def stop(self) -> None:
        self.app.state.service.close()      # unfinished requests answered first, while HTTP still serves
        super().stop()
