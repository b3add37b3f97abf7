"""The tinker routes of training models: create one (a LoRA over a base model), describe it, and train it
(forward_backward, whose body is protobuf, and optim_step); each computation is a job on the service's worker,
answered with a future."""

from __future__ import annotations

import numpy as np
from starlette.responses import JSONResponse

from strop.tinker_wire import codec
from strop.tinker_wire.codec import WireError
from strop.tinker_wire.limits import (ATTN, MAX_BODY_BYTES, MAX_DATUMS, MAX_REQUEST_TOKENS, MLP, adam_only,
                                      check_loss, peek_model_id, remember, str_dict, trained)
from strop.tinker_wire.tenants import new_run_record
from strop.tinker_wire.web import WireState, body_bytes, future_reply, read_model
from strop.types import AdamParams


def start_training(service, session, model, owner: str, **record) -> None:
    """Make a new model's LoRA training client from its `lora` settings and write its run's record (`record`:
    new_run_record's optional fields); a model whose client cannot be made is taken out of the service again."""
    lora = model.lora
    targets = (ATTN if lora["train_attn"] else []) + (MLP if lora["train_mlp"] else [])
    try:
        model.client = service.strop.create_lora_training_client(
            base_model=model.base_model, rank=model.rank, seed=lora.get("seed"),
            target_modules=None if lora["train_attn"] and lora["train_mlp"] else targets)
    except BaseException:
        service.models.pop(model.id, None)
        session.models.discard(model.id)
        raise
    service.store.record_run(model.id, new_run_record(
        owner=owner, base_model=model.base_model, lora_rank=model.rank, lora=lora,
        project_id=session.project_id, **record))


def register_model_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service = state.service

    @state.route("/api/v1/create_model")
    async def create_model(request, who):
        req = await read_model(request, types.CreateModelRequest)
        session = service.session(req.session_id, who)
        adam_only(req.optimizer_config)
        lora = req.lora_config or types.LoraConfig(rank=32)
        if not 1 <= lora.rank <= 256:
            raise WireError(f"LoRA rank {lora.rank} is outside 1..256")
        if not (lora.train_attn or lora.train_mlp):
            raise WireError("this server adapts attention and MLP projections (train_attn, train_mlp); "
                            "train_unembed alone is not supported")
        await service.resolve(req.base_model)   # an unknown model is refused now, not in the future; off the loop
        model = service.add_model(session, req.model_seq_id, req.base_model, lora.rank,
                                  {"train_attn": lora.train_attn, "train_mlp": lora.train_mlp,
                                   "train_unembed": lora.train_unembed, "seed": lora.seed})

        def run():
            start_training(service, session, model, who, user_metadata=str_dict(req.user_metadata))
            return {"type": "create_model", "model_id": model.id}
        return future_reply(service.submit(session, "CreateModel", run), model_id=model.id)

    @state.route("/api/v1/get_info")
    async def get_info(request, who):
        req = await read_model(request, types.GetInfoRequest)
        model = service.model(req.model_id, who)
        info = service.model_info(model.base_model)
        return JSONResponse({"type": "get_info", "model_id": model.id, "is_lora": True, "lora_rank": model.rank,
                             "model_name": model.base_model,
                             "model_data": {"arch": info["arch"], "model_name": model.base_model,
                                            "tokenizer_id": info["folder"]}})


def register_training_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service = state.service

    @state.route("/api/v1/forward_backward")
    async def forward_backward(request, who):
        if "protobuf" not in request.headers.get("content-type", ""):
            raise WireError("forward_backward takes a protobuf body (Content-Type: application/x-protobuf), as the "
                            "tinker SDK sends it", 415)
        raw = await body_bytes(request, MAX_BODY_BYTES)
        model_id = peek_model_id(raw)
        model = service.model(model_id, who)
        info = service.model_info(model.base_model)
        _, seq_id, data, loss_fn, config, forward_only = codec.read_forward_backward(
            raw, vocab_size=info["vocab_size"], max_tokens=info["context"], max_datums=MAX_DATUMS,
            check_loss=check_loss)
        total = sum(d.model_input.length for d in data)
        if total > MAX_REQUEST_TOKENS:
            raise WireError(f"{total} tokens in one forward_backward request; this server takes at most "
                            f"{MAX_REQUEST_TOKENS} (split the batch into several calls)", 413)
        if seq_id and seq_id in model.seq_futures:
            return future_reply(model.seq_futures[seq_id], model_id=model.id)
        session = service.session(model.session_id, who)

        def run():
            client = trained(model)
            call = client.forward if forward_only else client.forward_backward
            output = call(data, loss_fn=loss_fn, loss_fn_config=config or None).result()
            return codec.write_forward_backward_output(output)
        future_id = service.submit(session, "Forward" if forward_only else "ForwardBackward", run, cost=len(raw))
        remember(model.seq_futures, seq_id, future_id)
        return future_reply(future_id, model_id=model.id)

    @state.route("/api/v1/optim_step")
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
            metrics = trained(model).optim_step(adam).result().metrics
            return {"metrics": {k: float(v) for k, v in metrics.items()}}
        future_id = service.submit(session, "OptimStep", run)
        if req.seq_id:
            remember(model.seq_futures, req.seq_id, future_id)
        return future_reply(future_id, model_id=model.id)
