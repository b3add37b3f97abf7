"""Serve a strop environment over OpenEnv's protocol, so any OpenEnv client (OpenEnv's own `GenericEnvClient` and
`MCPToolClient`, TRL, torchforge, strop's `RemoteEnv`) can run episodes on it by URL.

    server = serve_env("finance-sql", port=0, options={"seed": 0}, block=False)   # started in a thread
    # from openenv.core.mcp_client import MCPToolClient
    # with MCPToolClient(base_url=server.url).sync() as env:
    #     env.reset(split="train", index=0); env.list_tools(); env.call_tool("list_tables")
    server.stop()

The protocol is OpenEnv's (the `openenv` package on PyPI, 0.10; it was `openenv-core` until mid-2026), in its
MCP tool-calling form: an action is `{"type": "list_tools"}` or `{"type": "call_tool", "tool_name": ...,
"arguments": {...}}`, and a strop `ToolCall` is one `call_tool`.

WebSocket `/ws` (one environment instance per connection; `?session_id=ID` attaches to a session made with
`openenv/session/create`). Client frames -> server frames:
    {"type": "reset", "data": {task_id?, split?, index?, seed?, episode_id?}} -> {"type": "observation", "data": R}
    {"type": "step", "data": ACTION}                                          -> {"type": "observation", "data": R}
    {"type": "state"}                                     -> {"type": "state", "data": {episode_id, step_count, ...}}
    {"type": "mcp", "data": JSON-RPC request}                            -> {"type": "mcp", "data": JSON-RPC reply}
    {"type": "close"}                                                                 -> the server closes the socket
    anything wrong                              -> {"type": "error", "data": {"message": ..., "code": ...}}; go on
where R = {"observation": {...}, "reward": float | None, "done": bool}. The reset observation is `{content,
task_id, split, episode_id, metadata}`; list_tools' is `{tools: [{name, description, input_schema}]}`; call_tool's is
`{tool_name, result: {content: [{type: "text", text}], data: text, is_error}, error: null | {error_type, message},
metadata, info}`. Reset picks the task by `task_id`, else `index` in `split`, else at random (`seed`ed if given).

Hostile clients cost bounded time and memory: a request's head must arrive within `read_timeout_s` of the
connection opening (or of the last reply), and its body within `read_timeout_s` more (408); heads are at most
16 kB, bodies and frames `max_message_bytes` (413, or an error frame; a frame over 4x that closes the socket); a
WebSocket with no message for `session_idle_s` gets an error frame and is closed, and so is its session, as is
an HTTP-made session idle that long; past `max_sessions` sessions a new one is refused (CAPACITY_REACHED).

HTTP: GET /health (no key needed), /schema, /metadata, /openapi.json; POST /mcp (JSON-RPC 2.0: tools/list,
tools/call, openenv/session/create, openenv/session/close); OpenEnv's task API: GET /list_environments,
GET /{env}/splits, POST /{env}/tasks, /{env}/num_tasks, /{env}/task, /{env}/task_range (gold answers withheld
unless `reveal_answers`). With an `api_key`, every other route wants `Authorization: Bearer KEY` (or
`X-API-Key: KEY`). Each session's environment lives on its own thread, so an environment holding a SQLite
connection is only ever used from the thread that made it.

The protocol itself (sessions, messages, MCP actions, schemas) is `strop.envs.openenv_protocol`; this module is
its transport.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from strop.envs import get_env
from strop.envs.base import Environment
from strop.envs.openenv_json import ProtocolError, dumps, is_int, parse_json
from strop.envs.openenv_protocol import MAX_SESSIONS, SESSION_IDLE_S, EnvService, schemas
from strop.errors import StropError

MAX_MESSAGE_BYTES = 1 << 20     # a client frame or request body; tool calls and resets are small
READ_TIMEOUT_S = 10.0           # for a request's head, then for its body: a slow or silent client is dropped
MAX_HEAD_BYTES = 16 << 10       # a request line and headers
INSTALL = "pip install 'strop[openenv]'  (starlette, uvicorn, websockets)"


HTTP_ROUTES = {"/health": "get", "/schema": "get", "/metadata": "get", "/mcp": "post",
               "/list_environments": "get", "/{env_name}/splits": "get", "/{env_name}/tasks": "post",
               "/{env_name}/num_tasks": "post", "/{env_name}/task": "post", "/{env_name}/task_range": "post"}


def make_env_app(env_factory: Callable[[], Environment], *, api_key: str | None = None,
                 max_sessions: int = MAX_SESSIONS, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 session_idle_s: float = SESSION_IDLE_S, read_timeout_s: float = READ_TIMEOUT_S,
                 reveal_answers: bool = False):
    """An ASGI app (Starlette) speaking OpenEnv's protocol for the environments `env_factory` makes, one per
    session. `app.state.service` is its `EnvService`."""
    try:
        # lazy: optional, its absence is handled here
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.responses import JSONResponse as StarletteJSON
        from starlette.routing import Route, WebSocketRoute
        from starlette.websockets import WebSocketDisconnect
    except ImportError:
        raise StropError(f"serving an environment over OpenEnv needs starlette and uvicorn: {INSTALL}") from None
    service = EnvService(env_factory, max_sessions=max_sessions, session_idle_s=session_idle_s,
                         reveal_answers=reveal_answers)

    class JSONResponse(StarletteJSON):
        def render(self, content) -> bytes:     # strict JSON whatever the environment put in a reply
            return dumps(content).encode("ascii")
    too_large = f"the message is over the server's limit of {max_message_bytes} bytes (--max-message-bytes)"

    async def read_json(request) -> Any:
        body = bytearray()
        try:
            async with asyncio.timeout(read_timeout_s):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > max_message_bytes:
                        raise ProtocolError("MESSAGE_TOO_LARGE", too_large)
        except TimeoutError:
            raise ProtocolError("REQUEST_TIMEOUT", f"the request body did not arrive within {read_timeout_s:g} s; "
                                                   "send it whole, at once") from None
        return parse_json(bytes(body), "request body")

    async def reap_forever():
        while True:
            await asyncio.sleep(min(60.0, session_idle_s / 4))
            await service.reap_idle()

    @asynccontextmanager
    async def lifespan(app):
        reaper = asyncio.create_task(reap_forever())  # idle HTTP-made sessions are closed without a new client
        try:
            yield
        finally:
            reaper.cancel()
            await service.shutdown()

    ws_endpoint = _ws_endpoint(service, session_idle_s=session_idle_s, max_message_bytes=max_message_bytes,
                               too_large=too_large, disconnect=WebSocketDisconnect)
    routes = [*_http_routes(service, JSONResponse, read_json, Route), WebSocketRoute("/ws", ws_endpoint)]

    async def http_error(request, exc):
        if isinstance(exc, ProtocolError):
            status = {"MESSAGE_TOO_LARGE": 413, "FACTORY_ERROR": 503, "REQUEST_TIMEOUT": 408}.get(exc.code, 400)
            return JSONResponse({"detail": exc.message, "code": exc.code}, status_code=status)
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}", "code": "EXECUTION_ERROR"}, status_code=500)

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(RequireKey, api_key=api_key)],
                    exception_handlers={ProtocolError: http_error, Exception: http_error})
    app.state.service = service
    return app


def _http_routes(service: EnvService, JSONResponse, read_json, Route) -> list:
    """The HTTP routes: health, schema, metadata, OpenAPI, POST /mcp and OpenEnv's task API. `JSONResponse`
    writes strict JSON; `read_json` reads a request body within the server's size and time limits."""

    async def health(request):
        return JSONResponse({"status": "healthy"})

    async def schema(request):
        return JSONResponse(schemas())

    async def metadata(request):
        return JSONResponse(await service.describe())

    async def list_environments(request):
        return JSONResponse([(await service.describe())["name"]])

    async def openapi(request):                         # enough for `openenv validate --url`
        info = {"title": f"strop environment {(await service.describe())['name']}", "version": "1.0.0"}
        paths = {path: {method: {"summary": path}} for path, method in HTTP_ROUTES.items()}
        return JSONResponse({"openapi": "3.1.0", "info": info, "paths": paths})

    async def mcp(request):
        try:
            body = await read_json(request)
        except ProtocolError as exc:
            if exc.code != "INVALID_JSON":
                raise                                   # too large: 413
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": exc.message}})
        return JSONResponse(await service.rpc(body))

    task_api = _task_api(service, JSONResponse, read_json)
    return [Route("/health", health), Route("/schema", schema), Route("/metadata", metadata),
            Route("/openapi.json", openapi), Route("/list_environments", list_environments),
            Route("/mcp", mcp, methods=["POST"]), Route("/{env_name}/splits", task_api),
            *[Route(f"/{{env_name}}/{r}", task_api, methods=["POST"]) for r in ("tasks", "num_tasks", "task",
                                                                                  "task_range")]]


def _task_api(service: EnvService, JSONResponse, read_json):
    """OpenEnv's task API: GET /{env}/splits; POST /{env}/tasks, num_tasks, task, task_range."""

    async def task_api(request):
        env_name, route = request.path_params["env_name"], request.url.path.rsplit("/", 1)[-1]
        description = await service.describe()
        if env_name.lower() != description["name"].lower():
            return JSONResponse({"detail": f"unknown environment {env_name!r}; this server has "
                                           f"{description['name']!r}"}, status_code=404)
        if route == "splits":
            return JSONResponse([{"name": s, "type": s if s in ("train", "validation", "test") else "validation"}
                                 for s in description["splits"]])
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("split"), str):
            raise ProtocolError("VALIDATION_ERROR", "the body must be a JSON object with 'split' (a string)")
        start, stop = (body.get("index"), None) if route == "task" else (body.get("start"), body.get("stop"))
        if route == "task":
            if not (is_int(start) and start >= 0):
                raise ProtocolError("VALIDATION_ERROR", "the body needs 'index' (a non-negative integer)")
            stop = start + 1
        elif not all(b is None or is_int(b) for b in (start, stop)):
            raise ProtocolError("VALIDATION_ERROR", "'start' and 'stop' must be integers or null")
        specs = await service.task_specs(body["split"], start, stop)
        if route == "tasks":
            return JSONResponse({"tasks": specs, "env_name": description["name"]})
        if route == "num_tasks":
            return JSONResponse({"num_tasks": len(specs)})
        if route == "task_range":
            return JSONResponse({"tasks": specs})
        if not specs:
            raise ProtocolError("VALIDATION_ERROR", f"index {start} is out of range for split {body['split']!r}")
        return JSONResponse({"task": specs[0]})
    return task_api


def _ws_endpoint(service: EnvService, *, session_idle_s: float, max_message_bytes: int, too_large: str,
                 disconnect: type[Exception]):
    """The WebSocket /ws endpoint: one session per connection (or the HTTP-made one `?session_id=` names), its
    frames answered in order until the client closes, goes away or idles past `session_idle_s`. `disconnect` is
    Starlette's WebSocketDisconnect."""

    async def ws_endpoint(websocket):
        await websocket.accept()
        session, requested = None, websocket.query_params.get("session_id")
        try:
            if requested:                               # MCPToolClient: attach to its HTTP-made session
                found = service.sessions.get(requested)
                if found is None or found.owner != "http" or found.attached:
                    why = "is unknown" if found is None else "cannot be attached (it has a WebSocket already)"
                    raise ProtocolError("SESSION_ERROR", f"session_id {requested!r} {why}")
                session, found.attached = found, True
            else:
                session = await service.create_session("ws")
            while True:
                try:
                    message = await asyncio.wait_for(websocket.receive(), timeout=session_idle_s)
                except TimeoutError:                    # an idle client must not hold a session forever
                    raise ProtocolError("SESSION_IDLE", f"no message for {session_idle_s:g} s, so this session is "
                                                        "closed (the server's --session-idle-timeout); connect "
                                                        "again and reset") from None
                if message["type"] == "websocket.disconnect":
                    break
                raw = message["text"] if message.get("text") is not None else message.get("bytes") or b""
                try:
                    if len(raw.encode() if isinstance(raw, str) else raw) > max_message_bytes:
                        raise ProtocolError("MESSAGE_TOO_LARGE", too_large)
                    reply = await service.handle(session, raw)
                except ProtocolError as exc:
                    reply = exc.frame()
                except Exception as exc:  # noqa: BLE001 -- an environment bug is reported, the socket stays up
                    reply = ProtocolError("EXECUTION_ERROR", f"{type(exc).__name__}: {exc}").frame()
                if reply is None:
                    break
                await websocket.send_text(dumps(reply))
        except ProtocolError as exc:                    # refused (full, an unknown session) or idle too long
            try:
                await websocket.send_text(dumps(exc.frame()))
            except (disconnect, RuntimeError):
                pass
        except (disconnect, RuntimeError):             # the client went away mid-reply
            pass
        finally:
            if session is not None and session.owner == "ws":
                await service.destroy(session.id)
            elif session is not None:
                session.attached = False
                if session.pending_close:
                    await service.destroy(session.id)
            try:
                await websocket.close()
            except Exception:  # noqa: BLE001 -- closed by the client already
                pass
    return ws_endpoint


class RequireKey:
    """ASGI middleware: with a key set, every route but /health wants `Authorization: Bearer KEY` or
    `X-API-Key: KEY`. A WebSocket without it gets an UNAUTHORIZED error frame, then a close (1008)."""

    OPEN = ("/health",)

    def __init__(self, app, api_key: str | None):
        self.app, self.api_key = app, api_key

    def problem(self, scope) -> str | None:
        if self.api_key is None or scope["type"] not in ("http", "websocket") or scope["path"] in self.OPEN:
            return None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        if given is None and auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        if given is None:
            return "this server needs an API key: send the header 'Authorization: Bearer KEY' (or 'X-API-Key: KEY')"
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            return "wrong API key (from 'Authorization: Bearer ...' or 'X-API-Key'); check the key the server uses"
        return None

    async def __call__(self, scope, receive, send):
        problem = self.problem(scope)
        if problem is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "http":
            body = json.dumps({"detail": problem}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()                                     # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps(
            {"type": "error", "data": {"message": problem, "code": "UNAUTHORIZED"}})})
        await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})


def bounded_h11(read_timeout_s: float):
    """uvicorn's HTTP/1.1 protocol with a deadline on request heads: a connection that has not sent a whole
    request head within `read_timeout_s` of opening (or of its last reply) is closed. uvicorn alone waits forever
    for a first request, and its keep-alive timer is reset by every byte, so one byte every few seconds (or none)
    held a connection open for good. A WebSocket, once upgraded, is bounded by its session's idle timeout."""
    # lazy: uvicorn is heavy or optional, loaded only when this runs
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(read_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                return                  # a request is being served: its body has the app's own deadline
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def handle_websocket_upgrade(self, event) -> None:
            self._disarm()
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedH11Protocol


class EnvServer:
    """A uvicorn server for an app from `make_env_app`, run in a background thread."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8000,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = 4 * MAX_SESSIONS):
        try:
            # lazy: optional, its absence is handled here
            import uvicorn
        except ImportError:
            raise StropError(f"serving an environment over OpenEnv needs uvicorn: {INSTALL}") from None
        # frames up to 4x the cap still arrive and get a clear MESSAGE_TOO_LARGE; larger ones close the socket
        # (1009). Past max_connections open connections, HTTP requests get 503 until some close.
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                http=bounded_h11(read_timeout_s), h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                                limit_concurrency=max_connections, ws_max_size=4 * max_message_bytes,
                                timeout_graceful_shutdown=5)
        self.app, self.host = app, host
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def service(self) -> EnvService:
        return self.app.state.service

    @property
    def port(self) -> int:
        return self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EnvServer:
        self._thread = threading.Thread(target=self._server.run, name="strop-openenv-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise StropError(f"the environment server did not start on {self.host}:{self._server.config.port} "
                                 "(is the port in use? see the log above)")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C stops it)."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(timeout=0.5)
        except KeyboardInterrupt:
            self.stop()


def serve_env(env: str | Callable[[], Environment], *, host: str = "127.0.0.1", port: int = 8000,
              api_key: str | None = None, options: dict | None = None, max_sessions: int = MAX_SESSIONS,
              max_message_bytes: int = MAX_MESSAGE_BYTES, session_idle_s: float = SESSION_IDLE_S,
              read_timeout_s: float = READ_TIMEOUT_S, reveal_answers: bool = False,
              block: bool = True) -> EnvServer:
    """Serve an environment (a strop name with `options` for `get_env`, or a factory) over OpenEnv's protocol.
    Binds 127.0.0.1 unless told otherwise; port 0 takes any free port (`server.url` says which). With
    `block=False` it returns the started server; otherwise it serves until Ctrl-C."""
    if callable(env):
        if options:
            raise StropError("serve_env: 'options' go with an environment name; bake them into your factory")
        factory = env
    else:
        name, opts = env, dict(options or {})
        get_env(name, **opts).close()                         # a bad name or option fails here, not per session
        factory = lambda: get_env(name, **opts)                # noqa: E731
    app = make_env_app(factory, api_key=api_key, max_sessions=max_sessions, max_message_bytes=max_message_bytes,
                       session_idle_s=session_idle_s, read_timeout_s=read_timeout_s, reveal_answers=reveal_answers)
    server = EnvServer(app, host=host, port=port, max_message_bytes=max_message_bytes, read_timeout_s=read_timeout_s,
                       max_connections=max(64, 4 * max_sessions)).start()
    if block:
        print(f"strop: serving environment {env if isinstance(env, str) else 'from factory'} at {server.url} "
              "(OpenEnv protocol: WebSocket /ws, POST /mcp; Ctrl-C stops)", file=sys.stderr)
        server.wait()
    return server
