"""The tinker routes of sessions: create, heartbeat, finish, look up, list, and move into a project."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from strop.tinker_wire.codec import WireError
from strop.tinker_wire.limits import MAX_JSON_BYTES, project, str_dict
from strop.tinker_wire.web import WireState, body_bytes, page, read_field, read_model


def register_session_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service, tenancy = state.service, state.tenancy

    @state.route("/api/v1/create_session")
    async def create_session(request, who):
        req = await read_model(request, types.CreateSessionRequest)
        holder = tenancy.quota_holder(who, request.client.host if request.client else None)
        session = service.create_session(who, req.tags, req.user_metadata, project(req.project_id), holder=holder)
        return JSONResponse({"type": "create_session", "session_id": session.id})

    @state.route("/api/v1/session_heartbeat")
    async def heartbeat(request, who):
        req = await read_model(request, types.SessionHeartbeatRequest)
        service.session(req.session_id, who)
        return JSONResponse({"type": "session_heartbeat"})

    @state.route("/api/v1/sessions/{session_id}/finish")
    async def finish(request, who):
        raw = await body_bytes(request, MAX_JSON_BYTES)
        try:
            reason = str((json.loads(raw or b"{}").get("reason") or {}).get("type", "success"))[:40]
        except (ValueError, AttributeError, RecursionError):
            reason = "success"
        service.finish_session(request.path_params["session_id"], who, reason)
        return JSONResponse({})

    @state.route("/api/v1/sessions/{session_id}", methods=("GET",))
    async def get_session(request, who):
        session = service.session(request.path_params["session_id"], who, live=False)
        return JSONResponse({"training_run_ids": sorted(session.models), "sampler_ids": sorted(session.samplers),
                             "user_metadata": str_dict(session.user_metadata)})

    @state.route("/api/v1/sessions", methods=("GET",))
    async def list_sessions(request, who):
        with service.lock:
            mine = sorted((s for s in service.sessions.values() if s.owner == who), key=lambda s: -s.created)
        shown, cursor = page(request, [s.id for s in mine])
        return JSONResponse({"sessions": shown, "cursor": cursor})

    @state.route("/api/v1/sessions/{session_id}/project", methods=("PUT",))
    async def assign_project(request, who):
        moved_to = project(await read_field(request, "project_id", '{"project_id": "..."}'))
        if moved_to is None:
            raise WireError("project_id is missing; a session cannot be moved out of a project")
        session = service.session(request.path_params["session_id"], who, live=False)
        session.project_id = moved_to
        for run_id in sorted(session.models):         # its training runs move with it
            try:
                info = service.store.run_info(run_id, who)
            except WireError:
                continue                              # a model whose creation failed has no run
            service.store.record_run(run_id, {**info, "project_id": moved_to})
        return JSONResponse({})
