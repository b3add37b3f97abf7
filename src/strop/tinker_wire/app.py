"""The HTTP side of `strop serve-tinker`: the routes the unmodified `tinker` SDK calls, over a `TinkerService`.

    app = make_tinker_app(service, api_keys={"tml-..."})      # or open_mode=True: any key, quotas per address
    server = TinkerServer(app, port=0).start()                 # TINKER_BASE_URL=server.url

JSON bodies are read with the SDK's own request models (so a field the SDK sends is a field this server reads);
forward_backward arrives as protobuf, and ForwardBackwardOutput and SampleResponse results go back as protobuf,
as the SDK asks. Errors are `{"detail": message}` with a status the SDK maps to its own exception types (400
BadRequestError, 401 AuthenticationError, 404 NotFoundError, 413, 429 RateLimitError); a computation that fails
reaches the caller as the SDK's RequestFailedError with the reason.

The routes are in the `routes_*` modules, one per resource, over the plumbing in `web` (the state they share,
request bodies, error replies) and the bounds in `limits`.
"""

from __future__ import annotations

from strop.envs.openenv_server import EnvServer
from strop.tinker_wire.limits import LONG_POLL_S, MAX_BODY_BYTES
from strop.tinker_wire.service import TinkerService
from strop.tinker_wire.tenants import Tenancy


def make_tinker_app(service: TinkerService, *, api_keys: set[str] | None = None, open_mode: bool = False,
                    sample_concurrency: int = 256, long_poll_s: float = LONG_POLL_S):
    """`api_keys`: the only keys accepted (each its own owner and quota); or `open_mode`: any key, each its own
    owner, quotas per client address (`strop.tinker_wire.tenants`). One of the two is required."""
    tenancy = Tenancy(api_keys, open_mode=open_mode)
    # lazy: starlette and the SDK's types load only when a server is made
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from strop.tinker_wire import (routes_checkpoints, routes_client, routes_sampling, routes_sessions,
                                   routes_training, routes_weights)
    from strop.tinker_wire.web import WireState

    state = WireState(service, tenancy, sample_concurrency, long_poll_s)
    for register in (routes_client.register_client_routes, routes_sessions.register_session_routes,
                     routes_client.register_future_routes, routes_training.register_model_routes,
                     routes_training.register_training_routes, routes_weights.register_save_routes,
                     routes_weights.register_load_routes, routes_sampling.register_sampling_routes,
                     routes_checkpoints.register_run_routes, routes_checkpoints.register_checkpoint_routes):
        register(state)

    async def not_found(request, exc):
        return JSONResponse({"detail": f"{request.method} {request.url.path[:200]} is not part of the tinker API "
                                       "this server speaks"}, status_code=getattr(exc, "status_code", 404))
    app = Starlette(routes=state.routes, exception_handlers={404: not_found, 405: not_found})
    app.state.service = service
    return app


class TinkerServer(EnvServer):
    """uvicorn in a background thread, with the same bounds on slow and oversized requests as the environment
    server (`strop.envs.openenv_server.EnvServer`)."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8000, read_timeout_s: float = 30.0):
        super().__init__(app, host=host, port=port, max_message_bytes=MAX_BODY_BYTES, read_timeout_s=read_timeout_s,
                         max_connections=1024)

    def stop(self) -> None:
        self.app.state.service.close()      # unfinished requests answered first, while HTTP still serves
        super().stop()
