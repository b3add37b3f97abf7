"""The tinker routes an SDK client calls around its work: health, its config and feature flags, the server's
capabilities, telemetry (read and dropped), and its requests' futures (long-polled results, cancels)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strop.models import CATALOG
from strop.tinker_wire.limits import MAX_DATUMS, MAX_JSON_BYTES
from strop.tinker_wire.web import WireState, body_bytes, finished, read_model


def client_config(sample_concurrency: int) -> dict:
    """The feature flags this server gives the SDK (tinker.types.ClientConfigResponse): API keys (no JWT
    exchange), httpx transport, one forward_backward chunk at a time, no server-side custom losses, per-request
    polling of results."""
    return {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "use_pyqwest_transport": False,
            "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False, "fwdbwd_max_chunk_len": MAX_DATUMS,
            "fwdbwd_max_chunk_bytes_count": 4_000_000, "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False, "sample_join_sampling_session": False,
            "sample_max_concurrent_requests": sample_concurrency, "sample_enable_stuck_detection": False}


def register_client_routes(state: WireState) -> None:
    async def healthz(request: Request):        # no key needed: a load balancer's probe
        return JSONResponse({"status": "ok"})
    state.routes.append(Route("/api/v1/healthz", healthz, methods=["GET"]))

    @state.route("/api/v1/client/config")
    async def config(request, who):
        return JSONResponse(client_config(state.sample_concurrency))

    @state.route("/api/v1/client/dynamic_config")
    async def dynamic_config(request, who):
        return JSONResponse({"refresh_interval_sec": 3600, "sample_cancel_enabled": False})

    @state.route("/api/v1/get_server_capabilities", methods=("GET",))
    async def capabilities(request, who):
        return JSONResponse({"supported_models": [
            {"model_name": e.model_id, "trainable": True, "sampleable": True} for e in CATALOG]})

    @state.route("/api/v1/telemetry")
    async def telemetry(request, who):
        await body_bytes(request, MAX_JSON_BYTES)     # read and dropped: this server sends nothing anywhere
        return JSONResponse({"status": "accepted"})


def register_future_routes(state: WireState) -> None:
    from tinker import types  # lazy: the SDK is an optional extra, needed once a server is made
    service = state.service

    @state.route("/api/v1/cancel_future")
    async def cancel(request, who):
        await body_bytes(request, MAX_JSON_BYTES)
        return JSONResponse({})

    @state.route("/api/v1/retrieve_future")
    async def retrieve(request, who):
        req = await read_model(request, types.FutureRetrieveRequest)
        record = service.future(req.request_id, who)
        if not await finished(service, record, state.long_poll_s):
            # not done yet: the SDK asks again at once (408 is its quiet try_again)
            return JSONResponse({"type": "try_again", "request_id": record.id, "queue_state": "active"},
                                status_code=408)
        if record.error is not None:
            return JSONResponse({"error": record.error, "category": record.category})
        if isinstance(record.payload, bytes):
            return Response(record.payload, media_type="application/x-protobuf")
        return JSONResponse(record.payload)
