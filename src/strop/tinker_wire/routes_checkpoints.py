"""The tinker routes of the REST client's training runs and checkpoints: listings (of one's own runs, or of every
run one can read), and a checkpoint's publishing, TTL and deletion."""

from __future__ import annotations

import asyncio
import time

from starlette.responses import JSONResponse

from strop.tinker_wire.checkpoints import KINDS, iso
from strop.tinker_wire.codec import WireError
from strop.tinker_wire.limits import MAX_TTL_S
from strop.tinker_wire.service import TinkerService
from strop.tinker_wire.web import WireState, page, read_field


def run_entry(service: TinkerService, run_id: str, info: dict, viewer: str | None = None) -> dict:
    """A training run as the REST client lists it (`viewer`: another key sees only its published checkpoints)."""
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


def register_run_routes(state: WireState) -> None:
    service = state.service

    @state.route("/api/v1/training_runs", methods=("GET",))
    async def training_runs(request, who):
        scope = request.query_params.get("access_scope", "owned")
        if scope not in ("owned", "accessible"):
            raise WireError(f"access_scope is 'owned' or 'accessible', not {scope[:40]!r}")
        project = request.query_params.get("project_id")

        def read():     # every run folder is read: on a thread, so other tenants' requests go on meanwhile
            found = service.store.runs(who, accessible=scope == "accessible")
            return [run_entry(service, run_id, info, who) for run_id, info in found
                    if project is None or info.get("project_id") == project]
        runs = await asyncio.to_thread(read)
        runs.sort(key=lambda r: r["last_request_time"], reverse=True)
        shown, cursor = page(request, runs)
        return JSONResponse({"training_runs": shown, "cursor": cursor})

    @state.route("/api/v1/training_runs/{run_id}", methods=("GET",))
    async def training_run(request, who):
        run_id = request.path_params["run_id"]
        return JSONResponse(run_entry(service, run_id, service.store.run_info(run_id, who)))

    @state.route("/api/v1/training_runs/{run_id}/checkpoints", methods=("GET",))
    async def run_checkpoints(request, who):
        return JSONResponse({"checkpoints": service.store.checkpoints(request.path_params["run_id"], who)})


def register_checkpoint_routes(state: WireState) -> None:
    """Registered after the run routes and in this order: a DELETE of `.../{kind}/{name}/publish` is an unpublish,
    not the deletion of a checkpoint of that path."""
    service = state.service
    checkpoint = "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}"

    def checkpoint_path(request) -> str:
        p = request.path_params
        return f"tinker://{p['run_id']}/{p['kind']}/{p['name']}"

    def set_public(request, who, public: bool) -> JSONResponse:
        path = checkpoint_path(request)
        folder, _ = service.store.folder(path, who)
        if bool(service.store.meta(folder).get("public")) == public:    # 400: the SDK retries a 409 for minutes
            raise WireError(f"{path} is public already" if public else f"{path} is not public")
        service.store.update(path, who, public=public)    # public: other keys may sample and load it, not change it
        return JSONResponse({})

    @state.route(checkpoint + "/publish", methods=("POST",))
    async def publish(request, who):
        return set_public(request, who, True)

    @state.route(checkpoint + "/publish", methods=("DELETE",))
    async def unpublish(request, who):
        return set_public(request, who, False)

    @state.route(checkpoint + "/ttl", methods=("PUT",))
    async def set_ttl(request, who):
        ttl = await read_field(request, "ttl_seconds", '{"ttl_seconds": 7200} (null: never expires)')
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL_S):
            raise WireError(f"ttl_seconds must be 1..{MAX_TTL_S} (10 years) or null (never expires), got "
                            f"{str(ttl)[:40]}")
        service.store.update(checkpoint_path(request), who, expires_at=time.time() + ttl if ttl else None)
        return JSONResponse({})

    @state.route("/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id:path}", methods=("DELETE",))
    async def delete_checkpoint(request, who):
        p = request.path_params
        service.store.delete(f"tinker://{p['run_id']}/{p['checkpoint_id']}", who)
        return JSONResponse({})

    @state.route("/api/v1/checkpoints", methods=("GET",))
    async def all_checkpoints(request, who):
        found = await asyncio.to_thread(        # reads every run folder: off the event loop
            lambda: [c for run_id, _ in service.store.runs(who) for c in service.store.checkpoints(run_id, who)])
        found.sort(key=lambda c: c["time"], reverse=True)
        shown, cursor = page(request, found)
        return JSONResponse({"checkpoints": shown, "cursor": cursor})
