"""OpenEnv's protocol apart from its transport: sessions (one environment each, on its own thread), the
messages a client sends (reset, step, state, mcp, close) and the replies they get, the MCP tool actions, JSON-RPC
errors and the published schemas. `strop.envs.openenv_server` puts this behind HTTP and a WebSocket; the error a
bad message raises and the strict JSON read and written are `strop.envs.openenv_json`.

    service = EnvService(lambda: get_env("finance-sql"))
    session = await service.create_session("ws")
    reply = await service.handle(session, '{"type": "reset", "data": {"split": "train", "index": 0}}')
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from strop.envs.base import Environment, Task, ToolCall
from strop.envs.openenv_json import ProtocolError, parse_json, shown
from strop.errors import StropError

MAX_SESSIONS = 64               # environment instances alive at once (one per connection)
SESSION_IDLE_S = 600.0          # a session with no message for this long is closed (a slow model's turn is minutes)
MESSAGE_TYPES = ("reset", "step", "state", "mcp", "close")
RESET_FIELDS = {"task_id": str, "split": str, "index": int, "seed": int, "episode_id": str}
RPC_METHODS = ("tools/list", "tools/call", "openenv/session/create", "openenv/session/close")
# error code -> JSON-RPC error code, for errors answered over POST /mcp or an "mcp" frame
RPC_CODES = {"INVALID_JSON": -32700, "INVALID_REQUEST": -32600, "SESSION_ERROR": -32600, "METHOD_NOT_FOUND": -32601,
             "VALIDATION_ERROR": -32602, "EXECUTION_ERROR": -32603, "CAPACITY_REACHED": -32000, "FACTORY_ERROR": -32000}


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
        self.touch()
        return await asyncio.wrap_future(self._thread.submit(fn, *args))

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the session was last used; 0 while a call on it is running."""
        return 0.0 if self.lock.locked() else time.monotonic() - self.last_active

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


def check_reset(data: Any) -> tuple[dict, list[str]]:
    """(the reset's fields, the names of those it ignores). A field strop's reset does not take is ignored, as
    OpenEnv's own server drops keyword arguments its environment's reset() does not accept (OpenEnv's runtime
    collector sends `options`); the reply names what it ignored. A field it takes must be of the right type."""
    if not isinstance(data, dict):
        raise ProtocolError("VALIDATION_ERROR", "reset: 'data' must be an object such as "
                                                '{"split": "train", "index": 0}')
    ignored = sorted(str(key)[:100] for key in set(data) - set(RESET_FIELDS))[:20]
    for key, kind in RESET_FIELDS.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) or
                                  (kind is int and value < 0) or (kind is str and len(value) > 255)):
            what = "a non-negative integer" if kind is int else "a string of at most 255 characters"
            raise ProtocolError("VALIDATION_ERROR", f"reset: {key!r} must be {what}, got {shown(value)}")
    return {k: v for k, v in data.items() if k in RESET_FIELDS and v is not None}, ignored


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
                 session_idle_s: float = SESSION_IDLE_S, reveal_answers: bool = False):
        if max_sessions < 1:
            raise StropError(f"max_sessions (--max-sessions) must be at least 1, got {max_sessions}")
        if not session_idle_s > 0:
            raise StropError(f"session_idle_s (--session-idle-timeout) must be a positive number of seconds, got "
                             f"{session_idle_s}")
        self.env_factory = env_factory
        self.max_sessions, self.session_idle_s, self.reveal_answers = max_sessions, session_idle_s, reveal_answers
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

    async def reap_idle(self) -> int:
        """Close the HTTP-made sessions no WebSocket holds that have been idle for over `session_idle_s` (a
        WebSocket's own session is closed by its endpoint when the socket idles that long); how many closed."""
        stale = [s for s in self.sessions.values()
                 if s.owner == "http" and not s.attached and s.idle_for() > self.session_idle_s]
        for session in stale:
            await self.destroy(session.id)
        return len(stale)

    async def create_session(self, owner: str) -> Session:
        await self.reap_idle()
        if len(self.sessions) >= self.max_sessions:
            raise ProtocolError("CAPACITY_REACHED", f"the server is at its limit of {self.max_sessions} sessions; "
                                                    "close one, or wait: a session idle for "
                                                    f"{self.session_idle_s:g} s is closed (--session-idle-timeout); "
                                                    "or restart the server with a larger --max-sessions")
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
        session.touch()
        message = parse_json(raw, 'message (send e.g. {"type": "state"})')
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError("VALIDATION_ERROR", "a message must be a JSON object with a string 'type', one of "
                                                    f"{list(MESSAGE_TYPES)}")
        kind = message["type"]
        if kind not in MESSAGE_TYPES:
            raise ProtocolError("UNKNOWN_TYPE", f"unknown message type {shown(kind)}; the types are "
                                                f"{list(MESSAGE_TYPES)}")
        allowed = {"type"} if kind in ("state", "close") else {"type", "data"}
        if set(message) - allowed:
            unknown = shown(sorted(set(message) - allowed))
            raise ProtocolError("VALIDATION_ERROR", f"{kind}: unexpected field(s) {unknown}; "
                                                    f"a {kind} message has only {sorted(allowed)}")
        if kind == "close":
            return None
        if kind == "mcp":
            return {"type": "mcp", "data": await self.rpc(message.get("data"), session)}
        if kind == "step" and "data" not in message:
            raise ProtocolError("VALIDATION_ERROR", "step: 'data' (the action) is missing")
        async with session.lock:
            if kind == "reset":
                return {"type": "observation", "data": await self.reset(session, *check_reset(message.get("data", {})))}
            if kind == "step":
                return {"type": "observation", "data": await self.step(session, message["data"])}
            return {"type": "state", "data": await self.state(session)}

    async def reset(self, session: Session, data: dict, ignored: list[str] = ()) -> dict:
        task = await session.run(choose_task, session, data)
        observation = await session.run(session.env.reset, task)
        session.task, session.step_count, session.done = task, 0, False
        session.episode_id = data.get("episode_id") or uuid.uuid4().hex
        metadata = dict(observation.metadata)
        if ignored:
            metadata["ignored_reset_fields"] = list(ignored)   # so a misspelt field is not silently lost
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
            raise ProtocolError("VALIDATION_ERROR", f"step: unexpected field(s) {shown(sorted(set(action) - allowed))} "
                                                    f"in a {kind} action; it takes {sorted(allowed)}")
        metadata = action.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ProtocolError("VALIDATION_ERROR", f"step: 'metadata' must be an object, got {shown(metadata)}")
        if kind == "list_tools":     # a step like any other (OpenEnv's state contract counts it), worth nothing
            tools = [mcp_tool(t) for t in await session.run(session.env.tools)]
            session.step_count += 1
            return {"observation": {"tools": tools, "metadata": {}}, "reward": 0.0, "done": session.done}
        name, arguments = action.get("tool_name"), action.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise ProtocolError("VALIDATION_ERROR", "step: a call_tool action needs 'tool_name' (a string)")
        if not isinstance(arguments, dict):
            raise ProtocolError("VALIDATION_ERROR", f"step: 'arguments' must be an object, got {shown(arguments)}")
        if session.task is None:
            raise ProtocolError("SESSION_ERROR", "no episode yet: send a reset before calling tools")
        if session.done:
            raise ProtocolError("SESSION_ERROR", "the episode is over (done); send a reset to start another")
        call_id = (metadata or {}).get("tool_call_id")
        call = ToolCall(name, arguments, call_id if isinstance(call_id, str) else None)
        try:
            result = await session.run(session.env.step, call)
        except Exception as exc:  # noqa: BLE001 -- OpenEnv reports a failing tool as an observation with an error
            error = {"error_type": "execution_error", "message": f"the environment failed: {type(exc).__name__}: {exc}"}
            return {"observation": {"tool_name": name, "result": None, "error": error, "metadata": {}, "info": {}},
                    "reward": None, "done": session.done}
        session.step_count, session.done = session.step_count + 1, bool(result.done)
        if not math.isfinite(float(result.reward)):   # strict JSON has no NaN: say so, do not send null for it
            raise ProtocolError("EXECUTION_ERROR", f"the environment gave {name} the reward {result.reward!r}, which "
                                                   "is not a finite number; the episode cannot be scored")
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
            raise ProtocolError("METHOD_NOT_FOUND", f"unknown method {shown(method)}; the methods are "
                                                    f"{list(RPC_METHODS)}")
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
        """The session a JSON-RPC call names by id: one made by openenv/session/create. A WebSocket's own session
        is reached only over its socket (its id is no key to it from elsewhere)."""
        if session_id is None:
            return None
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None or session.owner != "http":
            raise ProtocolError("VALIDATION_ERROR", f"unknown session_id {shown(session_id)} (closed, idle for over "
                                                    f"{self.session_idle_s:g} s, or a WebSocket's own session, "
                                                    "which only that socket uses); make one with "
                                                    "openenv/session/create")
        return session

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
            raise ProtocolError("VALIDATION_ERROR", f"unknown split {shown(split)}; the splits are "
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
