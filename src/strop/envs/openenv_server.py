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

HTTP: GET /health (no key needed), /schema, /metadata, /openapi.json; POST /mcp (JSON-RPC 2.0: tools/list,
tools/call, openenv/session/create, openenv/session/close); OpenEnv's task API: GET /list_environments,
GET /{env}/splits, POST /{env}/tasks, /{env}/num_tasks, /{env}/task, /{env}/task_range (gold answers withheld
unless `reveal_answers`). With an `api_key`, every other route wants `Authorization: Bearer KEY` (or
`X-API-Key: KEY`). Each session's environment lives on its own thread, so an environment holding a SQLite
connection is only ever used from the thread that made it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from strop.envs.base import Environment, Task, ToolCall
from strop.errors import StropError

MAX_MESSAGE_BYTES = 1 << 20     # a client frame or request body; tool calls and resets are small
MAX_SESSIONS = 64               # environment instances alive at once (one per connection)
SESSION_TTL_S = 600.0           # an HTTP-made session nobody uses for this long is closed
INSTALL = "pip install 'strop[openenv]'  (starlette, uvicorn, websockets)"
MESSAGE_TYPES = ("reset", "step", "state", "mcp", "close")
RESET_FIELDS = {"task_id": str, "split": str, "index": int, "seed": int, "episode_id": str}
RPC_METHODS = ("tools/list", "tools/call", "openenv/session/create", "openenv/session/close")
# error code -> JSON-RPC error code, for errors answered over POST /mcp or an "mcp" frame
RPC_CODES = {"INVALID_JSON": -32700, "INVALID_REQUEST": -32600, "SESSION_ERROR": -32600, "METHOD_NOT_FOUND": -32601,
             "VALIDATION_ERROR": -32602, "EXECUTION_ERROR": -32603, "CAPACITY_REACHED": -32000, "FACTORY_ERROR": -32000}


class ProtocolError(Exception):
    """A message the server cannot act on: an error frame (or JSON-RPC error) naming what to fix, never a crash."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message

    def frame(self) -> dict:
        return {"type": "error", "data": {"message": self.message, "code": self.code}}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def mcp_tool(tool: dict) -> dict:
    """An OpenAI-style function schema as an MCP tool (`input_schema`, OpenEnv's spelling)."""
    fn = tool.get("function", tool)
    return {"name": fn["name"], "description": fn.get("description", ""),
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}}


class Session:
    """One environment instance and its episode. Every call on the environment runs on the session's own single
    thread, in order (an environment holding a SQLite connection may only use it from the thread that made it)."""

    def __init__(self, env_factory: Callable[[], Environment], owner: str):
        self.id, self.owner = uuid.uuid4().hex, owner   # owner "ws": closed with its socket; "http": by session/close
        self.attached = self.pending_close = False      # an "http" session in use by a WebSocket; to close after it
        self.lock, self.last_active = asyncio.Lock(), time.monotonic()
        self.env: Environment | None = None
        self.task: Task | None = None
        self.episode_id: str | None = None
        self.step_count, self.done = 0, False
        self.tasks_by_split: dict[str, list[Task]] = {}
        self._factory = env_factory
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strop-env")

    async def start(self) -> None:
        self.env = await self.run(self._factory)

    async def run(self, fn, *args):
        self.last_active = time.monotonic()
        return await asyncio.wrap_future(self._thread.submit(fn, *args))

    async def close(self) -> None:
        if self.env is not None:
            try:
                await self.run(self.env.close)
            except Exception as exc:  # noqa: BLE001 -- a failing close must not take the server down
                print(f"strop: closing the environment of session {self.id} failed: {exc}", file=sys.stderr)
        self._thread.shutdown(wait=False)

    def tasks(self, split: str) -> list[Task]:
        """The split's tasks, read once per session (call on the session's thread)."""
        if split not in self.tasks_by_split:
            self.tasks_by_split[split] = list(self.env.tasks(split))
        return self.tasks_by_split[split]


def check_reset(data: Any) -> dict:
    if not isinstance(data, dict):
        raise ProtocolError("VALIDATION_ERROR", "reset: 'data' must be an object such as "
                                                '{"split": "train", "index": 0}')
    if set(data) - set(RESET_FIELDS):
        raise ProtocolError("VALIDATION_ERROR", f"reset: unknown field(s) {sorted(set(data) - set(RESET_FIELDS))}; "
                                                f"reset takes {sorted(RESET_FIELDS)}")
    for key, kind in RESET_FIELDS.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) or
                                  (kind is int and value < 0) or (kind is str and len(value) > 255)):
            what = "a non-negative integer" if kind is int else "a string of at most 255 characters"
            raise ProtocolError("VALIDATION_ERROR", f"reset: {key!r} must be {what}, got {value!r}")
    return {k: v for k, v in data.items() if v is not None}


def choose_task(session: Session, data: dict) -> Task:
    """The task a reset asks for: by `task_id`, else `index` in `split`, else at random (call on the session's
    thread)."""
    splits = list(session.env.splits())
    split = data.get("split")
    if split is not None and split not in splits:
        raise ProtocolError("VALIDATION_ERROR", f"reset: unknown split {split!r}; the splits are {splits}")
    if "task_id" in data:
        names = [split] if split else splits
        for task in (task for name in names for task in session.tasks(name)):
            if task.id == data["task_id"]:
                return task
        raise ProtocolError("VALIDATION_ERROR", f"reset: no task {data['task_id']!r} in split(s) {names}; list "
                                                "them with POST /<env>/tasks")
    split = split or ("train" if "train" in splits else splits[0])
    tasks = session.tasks(split)
    if not tasks:
        raise ProtocolError("VALIDATION_ERROR", f"reset: split {split!r} has no tasks")
    if "index" in data:
        if data["index"] >= len(tasks):
            raise ProtocolError("VALIDATION_ERROR", f"reset: index {data['index']} is out of range; split {split!r} "
                                                    f"has {len(tasks)} tasks (0..{len(tasks) - 1})")
        return tasks[data["index"]]
    rng = random.Random(data["seed"]) if "seed" in data else random
    return tasks[rng.randrange(len(tasks))]


def step_payload(tool_name: str, result) -> dict:
    """A strop StepResult as OpenEnv's serialized CallToolObservation."""
    content, metadata = result.observation.content, dict(result.observation.metadata)
    observation = {"tool_name": tool_name, "error": None, "metadata": metadata, "info": dict(result.info),
                   "result": {"content": [{"type": "text", "text": content}], "structured_content": None,
                              "data": content, "is_error": False}}
    return {"observation": observation, "reward": float(result.reward), "done": bool(result.done),
            **({"metadata": metadata} if metadata else {})}


class EnvService:
    """The protocol without the transport: the sessions, and what each message or JSON-RPC call does."""

    def __init__(self, env_factory: Callable[[], Environment], *, max_sessions: int = MAX_SESSIONS,
                 session_ttl_s: float = SESSION_TTL_S, reveal_answers: bool = False):
        if max_sessions < 1:
            raise StropError(f"max_sessions must be at least 1, got {max_sessions}")
        self.env_factory = env_factory
        self.max_sessions, self.session_ttl_s, self.reveal_answers = max_sessions, session_ttl_s, reveal_answers
        self.sessions: dict[str, Session] = {}
        self._probe: Session | None = None        # answers /metadata, the task API and tools/list without a session
        self._probe_lock = asyncio.Lock()
        self._description: dict | None = None

    # --- sessions ---------------------------------------------------------------------------------------------

    async def start(self, session: Session) -> Session:
        try:
            await session.start()
        except Exception as exc:  # noqa: BLE001
            await session.close()
            raise ProtocolError("FACTORY_ERROR", f"could not make the environment: {type(exc).__name__}: {exc}") \
                from None
        return session

    async def create_session(self, owner: str) -> Session:
        now = time.monotonic()
        for stale in [s for s in self.sessions.values()
                      if s.owner == "http" and not s.attached and now - s.last_active > self.session_ttl_s]:
            await self.destroy(stale.id)
        if len(self.sessions) >= self.max_sessions:
            raise ProtocolError("CAPACITY_REACHED", f"the server is at its limit of {self.max_sessions} sessions; "
                                                    "close one, or start the server with a larger max_sessions")
        session = Session(self.env_factory, owner)
        self.sessions[session.id] = session                 # counted while its environment is being made
        try:
            return await self.start(session)
        finally:
            if session.env is None:
                self.sessions.pop(session.id, None)

    async def destroy(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            await session.close()

    async def probe(self) -> Session:
        async with self._probe_lock:
            if self._probe is None:
                self._probe = await self.start(Session(self.env_factory, "probe"))
        return self._probe

    async def shutdown(self) -> None:
        for session_id in list(self.sessions):
            await self.destroy(session_id)
        if self._probe is not None:
            await self._probe.close()
            self._probe = None

    # --- WebSocket messages -----------------------------------------------------------------------------------

    async def handle(self, session: Session, raw: str | bytes) -> dict | None:
        """The reply frame to one client frame (None for close)."""
        try:
            message = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError("INVALID_JSON", f'the message is not JSON ({exc}); send e.g. {{"type": "state"}}') \
                from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError("VALIDATION_ERROR", "a message must be a JSON object with a string 'type', one of "
                                                    f"{list(MESSAGE_TYPES)}")
        kind = message["type"]
        if kind not in MESSAGE_TYPES:
            raise ProtocolError("UNKNOWN_TYPE", f"unknown message type {kind!r}; the types are {list(MESSAGE_TYPES)}")
        allowed = {"type"} if kind in ("state", "close") else {"type", "data"}
        if set(message) - allowed:
            raise ProtocolError("VALIDATION_ERROR", f"{kind}: unexpected field(s) {sorted(set(message) - allowed)}; "
                                                    f"a {kind} message has only {sorted(allowed)}")
        if kind == "close":
            return None
        if kind == "mcp":
            return {"type": "mcp", "data": await self.rpc(message.get("data"), session)}
        if kind == "step" and "data" not in message:
            raise ProtocolError("VALIDATION_ERROR", "step: 'data' (the action) is missing")
        async with session.lock:
            if kind == "reset":
                return {"type": "observation", "data": await self.reset(session, check_reset(message.get("data", {})))}
            if kind == "step":
                return {"type": "observation", "data": await self.step(session, message["data"])}
            return {"type": "state", "data": await self.state(session)}

    async def reset(self, session: Session, data: dict) -> dict:
        task = await session.run(choose_task, session, data)
        observation = await session.run(session.env.reset, task)
        session.task, session.step_count, session.done = task, 0, False
        session.episode_id = data.get("episode_id") or uuid.uuid4().hex
        metadata = dict(observation.metadata)
        return {"observation": {"content": observation.content, "task_id": task.id, "split": task.split,
                                "episode_id": session.episode_id, "metadata": metadata},
                "reward": None, "done": False, **({"metadata": metadata} if metadata else {})}

    async def step(self, session: Session, action: Any) -> dict:
        kind = action.get("type") if isinstance(action, dict) else None
        if kind not in ("list_tools", "call_tool"):
            raise ProtocolError("VALIDATION_ERROR", 'step: the action must be {"type": "list_tools"} or '
                                                    '{"type": "call_tool", "tool_name": ..., "arguments": {...}}')
        allowed = {"type", "metadata"} | ({"tool_name", "arguments"} if kind == "call_tool" else set())
        if set(action) - allowed:
            raise ProtocolError("VALIDATION_ERROR", f"step: unexpected field(s) {sorted(set(action) - allowed)} in a "
                                                    f"{kind} action; it takes {sorted(allowed)}")
        if kind == "list_tools":
            tools = [mcp_tool(t) for t in await session.run(session.env.tools)]
            return {"observation": {"tools": tools, "metadata": {}}, "reward": None, "done": session.done}
        name, arguments = action.get("tool_name"), action.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise ProtocolError("VALIDATION_ERROR", "step: a call_tool action needs 'tool_name' (a string)")
        if not isinstance(arguments, dict):
            raise ProtocolError("VALIDATION_ERROR", f"step: 'arguments' must be an object, got {arguments!r}")
        if session.task is None:
            raise ProtocolError("SESSION_ERROR", "no episode yet: send a reset before calling tools")
        if session.done:
            raise ProtocolError("SESSION_ERROR", "the episode is over (done); send a reset to start another")
        call = ToolCall(name, arguments, (action.get("metadata") or {}).get("tool_call_id"))
        try:
            result = await session.run(session.env.step, call)
        except Exception as exc:  # noqa: BLE001 -- OpenEnv reports a failing tool as an observation with an error
            error = {"error_type": "execution_error", "message": f"the environment failed: {type(exc).__name__}: {exc}"}
            return {"observation": {"tool_name": name, "result": None, "error": error, "metadata": {}, "info": {}},
                    "reward": None, "done": session.done}
        session.step_count, session.done = session.step_count + 1, bool(result.done)
        return step_payload(name, result)

    async def state(self, session: Session) -> dict:
        state = {"episode_id": session.episode_id, "step_count": session.step_count}
        return {**await session.run(session.env.state), **state} if session.task is not None else state

    # --- JSON-RPC (POST /mcp and "mcp" frames) -----------------------------------------------------------------

    async def rpc(self, request: Any, bound: Session | None = None) -> dict:
        """The JSON-RPC 2.0 reply to one request; `bound` is the session of the WebSocket it came over."""
        reply = {"jsonrpc": "2.0", "id": request.get("id") if isinstance(request, dict) else None}
        try:
            return {**reply, "result": await self._rpc(request, bound)}
        except ProtocolError as exc:
            return {**reply, "error": {"code": RPC_CODES.get(exc.code, -32602), "message": exc.message}}
        except Exception as exc:  # noqa: BLE001
            return {**reply, "error": {"code": -32603, "message": f"{type(exc).__name__}: {exc}"}}

    async def _rpc(self, request: Any, bound: Session | None) -> Any:
        if (not isinstance(request, dict) or request.get("jsonrpc") != "2.0"
                or not isinstance(request.get("method"), str)):
            raise ProtocolError("INVALID_REQUEST", 'not a JSON-RPC 2.0 request: send {"jsonrpc": "2.0", "method": '
                                                   '"tools/list", "params": {}, "id": 1}')
        method, params = request["method"], request.get("params") or {}
        if not isinstance(params, dict):
            raise ProtocolError("VALIDATION_ERROR", f"{method}: 'params' must be an object")
        if method not in RPC_METHODS:
            raise ProtocolError("METHOD_NOT_FOUND", f"unknown method {method!r}; the methods are {list(RPC_METHODS)}")
        if method == "openenv/session/create":
            return {"session_id": (bound or await self.create_session("http")).id}
        if method == "openenv/session/close":
            return await self._close_rpc(params.get("session_id"), bound)
        session = bound or self._session_of(params.get("session_id"))
        if method == "tools/list":
            session = session or await self.probe()
            tools = [mcp_tool(t) for t in await session.run(session.env.tools)]
            return {"tools": [{**t, "inputSchema": t["input_schema"]} for t in tools]}   # MCP's own spelling too
        if session is None:
            raise ProtocolError("VALIDATION_ERROR", "tools/call needs a session: make one with openenv/session/create "
                                                    "and pass its session_id (or call tools over the /ws WebSocket)")
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            raise ProtocolError("VALIDATION_ERROR", "tools/call: params need 'name' (a string) and 'arguments' "
                                                    "(an object)")
        async with session.lock:
            payload = await self.step(session, {"type": "call_tool", "tool_name": name, "arguments": arguments})
        observation = payload["observation"]
        if observation["error"] is not None:
            raise ProtocolError("EXECUTION_ERROR", observation["error"]["message"])
        return {**observation["result"], "meta": {"reward": payload["reward"], "done": payload["done"],
                                                  "metadata": observation["metadata"], "info": observation["info"]}}

    def _session_of(self, session_id: Any) -> Session | None:
        if session_id is not None and session_id not in self.sessions:
            raise ProtocolError("VALIDATION_ERROR", f"unknown session_id {session_id!r} (closed, or idle for over "
                                                    f"{self.session_ttl_s:.0f} s); make one with "
                                                    "openenv/session/create")
        return None if session_id is None else self.sessions[session_id]

    async def _close_rpc(self, session_id: Any, bound: Session | None) -> dict:
        if not session_id:
            raise ProtocolError("VALIDATION_ERROR", "openenv/session/close: params need 'session_id'")
        if bound is not None and session_id == bound.id:
            raise ProtocolError("INVALID_REQUEST", 'cannot close this WebSocket\'s own session; send {"type": "close"}')
        session = self._session_of(session_id)
        if session.attached:                      # closed when its WebSocket goes away
            session.pending_close = True
            return {"session_id": session_id, "closed": False, "closing": True}
        await self.destroy(session_id)
        return {"session_id": session_id, "closed": True}

    # --- task API and description -----------------------------------------------------------------------------

    async def task_specs(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict]:
        if split not in (await self.describe())["splits"]:
            raise ProtocolError("VALIDATION_ERROR", f"unknown split {split!r}; the splits are "
                                                    f"{(await self.describe())['splits']}")
        probe = await self.probe()
        tasks = await probe.run(probe.tasks, split)
        return [{"id": tasks[i].id, "index": i, "split": tasks[i].split, "prompt": tasks[i].prompt,
                 "meta": dict(tasks[i].meta), **({"answer": tasks[i].answer} if self.reveal_answers else {})}
                for i in range(len(tasks))[slice(start, stop)]]

    async def describe(self) -> dict:
        """GET /metadata: OpenEnv's fields, and strop's max_turns and splits."""
        if self._description is None:
            probe = await self.probe()
            env = probe.env
            doc = (type(env).__doc__ or "").strip().splitlines()
            self._description = {"name": env.name, "description": doc[0] if doc else f"strop environment {env.name}",
                                 "version": None, "author": None, "documentation_url": None, "readme_content": None,
                                 "max_turns": env.max_turns, "splits": list(await probe.run(env.splits))}
        return self._description


def schemas() -> dict:
    """JSON schemas of the actions, observations and state (GET /schema)."""
    meta = {"type": "object", "description": "free-form metadata"}
    common = {"done": {"type": "boolean"}, "reward": {"type": ["number", "null"]}, "metadata": meta}
    tool = {"type": "object", "required": ["name", "description", "input_schema"], "properties": {
        "name": {"type": "string"}, "description": {"type": "string"}, "input_schema": {"type": "object"}}}

    def obj(title, required, properties, closed=False):
        return {"title": title, "type": "object", "required": required, "properties": properties,
                **({"additionalProperties": False} if closed else {})}
    return {
        "action": {"title": "Action", "oneOf": [
            obj("ListToolsAction", ["type"], {"type": {"const": "list_tools"}, "metadata": meta}, closed=True),
            obj("CallToolAction", ["type", "tool_name"], {
                "type": {"const": "call_tool"}, "tool_name": {"type": "string"},
                "arguments": {"type": "object", "default": {}}, "metadata": meta}, closed=True)]},
        "observation": {"title": "Observation", "oneOf": [
            obj("ListToolsObservation", ["tools"], {**common, "tools": {"type": "array", "items": tool}}),
            obj("CallToolObservation", ["tool_name"], {**common, "tool_name": {"type": "string"}, "result": {},
                                                       "error": {"type": ["object", "null"]}, "info": meta})]},
        "reset_observation": obj("ResetObservation", ["content", "task_id"], {
            **common, "content": {"type": "string"}, "task_id": {"type": "string"}, "split": {"type": "string"},
            "episode_id": {"type": "string"}}),
        "state": {**obj("State", [], {"episode_id": {"type": ["string", "null"]},
                                      "step_count": {"type": "integer", "minimum": 0}}), "additionalProperties": True},
    }


HTTP_ROUTES = {"/health": "get", "/schema": "get", "/metadata": "get", "/mcp": "post",
               "/list_environments": "get", "/{env_name}/splits": "get", "/{env_name}/tasks": "post",
               "/{env_name}/num_tasks": "post", "/{env_name}/task": "post", "/{env_name}/task_range": "post"}


def make_env_app(env_factory: Callable[[], Environment], *, api_key: str | None = None,
                 max_sessions: int = MAX_SESSIONS, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 session_ttl_s: float = SESSION_TTL_S, reveal_answers: bool = False):
    """An ASGI app (Starlette) speaking OpenEnv's protocol for the environments `env_factory` makes, one per
    session. `app.state.service` is its `EnvService`."""
    try:
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.responses import JSONResponse
        from starlette.routing import Route, WebSocketRoute
        from starlette.websockets import WebSocketDisconnect
    except ImportError:
        raise StropError(f"serving an environment over OpenEnv needs starlette and uvicorn: {INSTALL}") from None
    service = EnvService(env_factory, max_sessions=max_sessions, session_ttl_s=session_ttl_s,
                         reveal_answers=reveal_answers)
    too_large = f"the message is over the server's limit of {max_message_bytes} bytes"

    async def read_json(request) -> Any:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_message_bytes:
                raise ProtocolError("MESSAGE_TOO_LARGE", too_large)
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError("INVALID_JSON", f"the request body is not JSON ({exc})") from None

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

    async def task_api(request):
        """OpenEnv's task API: GET /{env}/splits; POST /{env}/tasks, num_tasks, task, task_range."""
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
                message = await websocket.receive()
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
                await websocket.send_text(json.dumps(reply, default=str))
        except ProtocolError as exc:                    # refused: the server is full, or an unknown session
            await websocket.send_text(json.dumps(exc.frame()))
        except (WebSocketDisconnect, RuntimeError):     # the client went away mid-reply
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

    @asynccontextmanager
    async def lifespan(app):
        yield
        await service.shutdown()

    routes = [Route("/health", health), Route("/schema", schema), Route("/metadata", metadata),
              Route("/openapi.json", openapi), Route("/list_environments", list_environments),
              Route("/mcp", mcp, methods=["POST"]), Route("/{env_name}/splits", task_api),
              *[Route(f"/{{env_name}}/{r}", task_api, methods=["POST"]) for r in ("tasks", "num_tasks", "task",
                                                                                    "task_range")],
              WebSocketRoute("/ws", ws_endpoint)]
    async def http_error(request, exc):
        if isinstance(exc, ProtocolError):
            status = {"MESSAGE_TOO_LARGE": 413, "FACTORY_ERROR": 503}.get(exc.code, 400)
            return JSONResponse({"detail": exc.message, "code": exc.code}, status_code=status)
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}", "code": "EXECUTION_ERROR"}, status_code=500)

    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(RequireKey, api_key=api_key)],
                    exception_handlers={ProtocolError: http_error, Exception: http_error})
    app.state.service = service
    return app


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


class EnvServer:
    """A uvicorn server for an app from `make_env_app`, run in a background thread."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8000,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        try:
            import uvicorn
        except ImportError:
            raise StropError(f"serving an environment over OpenEnv needs uvicorn: {INSTALL}") from None
        # frames up to 4x the cap still arrive and get a clear MESSAGE_TOO_LARGE; larger ones close the socket (1009)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                ws_max_size=4 * max_message_bytes, timeout_graceful_shutdown=5)
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
              max_message_bytes: int = MAX_MESSAGE_BYTES, reveal_answers: bool = False,
              block: bool = True) -> EnvServer:
    """Serve an environment (a strop name with `options` for `get_env`, or a factory) over OpenEnv's protocol.
    Binds 127.0.0.1 unless told otherwise; port 0 takes any free port (`server.url` says which). With
    `block=False` it returns the started server; otherwise it serves until Ctrl-C."""
    if callable(env):
        if options:
            raise StropError("serve_env: 'options' go with an environment name; bake them into your factory")
        factory = env
    else:
        from strop.envs import get_env
        name, opts = env, dict(options or {})
        get_env(name, **opts).close()                         # a bad name or option fails here, not per session
        factory = lambda: get_env(name, **opts)                # noqa: E731
    app = make_env_app(factory, api_key=api_key, max_sessions=max_sessions, max_message_bytes=max_message_bytes,
                       reveal_answers=reveal_answers)
    server = EnvServer(app, host=host, port=port, max_message_bytes=max_message_bytes).start()
    if block:
        print(f"strop: serving environment {env if isinstance(env, str) else 'from factory'} at {server.url} "
              "(OpenEnv protocol: WebSocket /ws, POST /mcp; Ctrl-C stops)", file=sys.stderr)
        server.wait()
    return server
