"""The tinker routes of a training model's weights: save them (a `weights` checkpoint with the optimizer, a
`sampler_weights` one, or a sampling client of them without a file), load a checkpoint into a model (a new one
or one that exists), and describe a checkpoint's model."""

from __future__ import annotations

import time

from starlette.responses import JSONResponse

from strop.client import SamplingClient
from strop.tinker_wire.checkpoints import check_name, parse_path
from strop.tinker_wire.codec import WireError
from strop.tinker_wire.limits import str_dict, trained
from strop.tinker_wire.routes_training import start_training
from strop.tinker_wire.web import WireState, future_reply, read_field, read_model


def register_save_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service = state.service

    @state.route("/api/v1/save_weights")
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
            trained(model).trainer.save_state(folder)
            service.store.finish(path, who, str_dict(req.user_metadata), req.ttl_seconds)
            service.register(path, who)
            return {"type": "save_weights", "path": path}
        return future_reply(service.submit(session, "SaveWeights", run), model_id=model.id)

    @state.route("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request, who):
        req = await read_model(request, types.SaveWeightsForSamplerRequest)
        model = service.model(req.model_id, who)
        session = service.session(model.session_id, who)
        if req.path is not None:
            path = service.store.path_for(model.id, "sampler_weights", check_name(req.path))
            folder, _ = service.store.folder(path, who, must_exist=False)

            def run():
                trained(model).trainer.save_weights(folder)
                service.store.finish(path, who, str_dict(req.user_metadata), req.ttl_seconds)
                service.register(path, who)
                return {"type": "save_weights_for_sampler", "path": path}
        else:
            inflight = req.kind == "inflight"   # the model's inflight clients, older ones too, move to these weights

            def run():
                client = trained(model)
                snapshot = client.trainer.adapter_weights()
                with service.engine_lock:
                    sampling = SamplingClient(client.backend, model.base_model, adapter=snapshot)
                sampler = service.add_sampler(session, req.sampling_session_seq_id, model.base_model, None, sampling,
                                              inflight_of=model.id if inflight else None)
                if inflight:
                    service.publish_inflight(model.id, sampling)
                return {"type": "save_weights_for_sampler", "path": None, "sampling_session_id": sampler.id}
        return future_reply(service.submit(session, "SaveWeightsForSampler", run), model_id=model.id)


def register_load_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service = state.service

    @state.route("/api/v1/load_weights")
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
                # weights from the checkpoint, identity from this request: the loaded run's record (its owner,
                # its store run) is never copied, so this model's saves are registered as a run of the loader's
                start_training(service, session, model, who, loaded_from=req.path)
            trained(model).trainer.load_state(folder, with_optimizer=bool(req.optimizer))
            return {"type": "load_weights", "path": req.path, "model_id": model.id}
        return future_reply(service.submit(session, "LoadWeights", run), model_id=model.id)

    @state.route("/api/v1/weights_info")
    async def weights_info(request, who):
        path = await read_field(request, "tinker_path", '{"tinker_path": "tinker://..."}')
        _, info = service.store.folder(path, who, read=True)
        return JSONResponse({"base_model": info["base_model"], "is_lora": True, "lora_rank": info["lora_rank"],
                             "train_mlp": info.get("train_mlp"), "train_attn": info.get("train_attn"),
                             "train_unembed": info.get("train_unembed")})
