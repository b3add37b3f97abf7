"""A remote OpenEnv environment as a strop `Environment`, so strop's rollouts, evaluations and `strop envs try`
can drive any OpenEnv server by URL (one served by `strop.envs.openenv_server`, a Hugging Face Space, a container).

    env = RemoteEnv("http://127.0.0.1:8000", api_key="...")      # http(s):// or ws(s)://
    [task] = env.tasks("train", limit=1)                         # from OpenEnv's task API (POST /<env>/tasks)
    first = env.reset(task)                                      # {"type": "reset", ...} over the WebSocket /ws
    result = env.step(ToolCall("list_tables", {}))               # a call_tool action
    result.observation.content, result.reward, result.done
    env.state(); env.close()

It speaks OpenEnv's WebSocket protocol synchronously (one request, one reply, each within `timeout` seconds) on
one connection, which is one session on the server: episodes follow each other on it. `tools()` asks with a
list_tools action. A tool's result becomes the observation's text (the MCP text content joined, or the result's
`data`); a tool that failed on the server is an observation saying so, as strop's protocol wants. Reset sends the
task's id, split and index (`task.meta["index"]` from the task API); OpenEnv servers ignore the fields their
environment does not take.

A server is not trusted: an answer over `max_message_bytes`, one that is not JSON, or a reward that is not a
finite number is a RemoteEnvError naming the server, never a crash or a NaN in training. (How much of an
observation a model reads is `strop.rl.episodes.cap_observation`'s to bound.)
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from strop.envs.base import Observation, StepResult, Task, ToolCall
from strop.errors import StropError

DEFAULT_MAX_TURNS = 20            # when neither the caller nor the server's /metadata says
INSTALL = "pip install 'strop[openenv]'  (websockets)"


class RemoteEnvError(StropError):
    """The server refused a message, answered with an error frame, timed out, or went away."""


class RemoteEnv:
    """strop's `Environment` protocol over OpenEnv's WebSocket protocol (see the module docstring)."""

    def __init__(self, url: str, *, api_key: str | None = None, headers: dict[str, str] | None = None,
                 timeout: float = 60.0, connect_timeout: float = 10.0, max_message_bytes: int = 64 << 20,
                 name: str | None = None, max_turns: int | None = None, env_name: str | None = None):
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
            raise StropError(f"RemoteEnv: {url!r} is not a server URL; give e.g. http://127.0.0.1:8000")
        secure = parts.scheme in ("https", "wss")
        base = f"{parts.netloc}{parts.path.rstrip('/')}"
        self.url = f"{'https' if secure else 'http'}://{base}"
        self.ws_url = f"{'wss' if secure else 'ws'}://{base}/ws"
        self.headers = dict(headers or {})
        if api_key is not None:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout, self.connect_timeout, self.max_message_bytes = timeout, connect_timeout, max_message_bytes
        self._local = parts.hostname in ("127.0.0.1", "localhost", "::1")
        self._ws = None
        self._tools: list[dict] | None = None
        self._env_name = env_name
        meta = self._metadata()
        self.name = name or meta.get("name") or parts.netloc
        self.max_turns = int(max_turns or meta.get("max_turns") or DEFAULT_MAX_TURNS)

    # --- the Environment protocol -----------------------------------------------------------------------------

    def tools(self) -> list[dict[str, Any]]:
        if self._tools is None:
            observation = self._request({"type": "step", "data": {"type": "list_tools"}})["data"]["observation"]
            self._tools = [{"type": "function", "function": {
                "name": t["name"], "description": t.get("description") or "",
                "parameters": t.get("input_schema") or t.get("inputSchema") or {"type": "object", "properties": {}}}}
                for t in observation.get("tools") or []]
        return [dict(t) for t in self._tools]

    def splits(self) -> list[str]:
        return [s["name"] if isinstance(s, dict) else str(s) for s in self._task_api("GET", "splits")]

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        specs = self._task_api("POST", "tasks", {"split": split})["tasks"]
        tasks = [task_from_spec(spec, split, i) for i, spec in enumerate(specs)]
        return tasks if limit is None else tasks[:limit]

    def reset(self, task: Task) -> Observation:
        data = {"task_id": task.id, "split": task.split}
        if isinstance(task.meta.get("index"), int):
            data["index"] = task.meta["index"]
        observation = self._request({"type": "reset", "data": data})["data"]["observation"]
        return Observation(observation_text(observation), dict(observation.get("metadata") or {}))

    def step(self, call: ToolCall) -> StepResult:
        action = {"type": "call_tool", "tool_name": call.name, "arguments": dict(call.arguments)}
        if call.id is not None:
            action["metadata"] = {"tool_call_id": call.id}
        payload = self._request({"type": "step", "data": action})["data"]
        observation = payload.get("observation") or {}
        info = dict(observation.get("info") or {})
        if observation.get("error"):
            info["toolError"] = observation["error"]
        reward = payload.get("reward")
        if reward is not None and (not isinstance(reward, (int, float)) or isinstance(reward, bool)
                                   or not math.isfinite(reward)):
            raise RemoteEnvError(f"{self.url} answered {call.name} with reward {str(reward)[:50]!r}, which is not a "
                                 "finite number; the episode cannot be scored (a bug in that server's environment?)")
        return StepResult(Observation(observation_text(observation), dict(observation.get("metadata") or {})),
                          reward=float(reward or 0.0), done=bool(payload.get("done")), info=info)

    def state(self) -> dict[str, Any]:
        return dict(self._request({"type": "state"})["data"])

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.send(json.dumps({"type": "close"}))
            except Exception:  # noqa: BLE001 -- already gone
                pass
            ws.close()

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- transport --------------------------------------------------------------------------------------------

    def _connect(self):
        try:
            # lazy: optional, its absence is handled here
            from websockets.exceptions import InvalidStatus
            from websockets.sync.client import connect
        except ImportError:
            raise StropError(f"RemoteEnv needs the websockets package: {INSTALL}") from None
        try:
            # __enter__ opens it the way websockets >= 17 wants (closed by close(), not a with-block)
            return connect(self.ws_url, additional_headers=self.headers, open_timeout=self.connect_timeout,
                           max_size=self.max_message_bytes, proxy=None if self._local else True).__enter__()
        except InvalidStatus as exc:
            raise RemoteEnvError(f"{self.ws_url} refused the WebSocket: HTTP {exc.response.status_code}") from None
        except (OSError, TimeoutError) as exc:
            raise RemoteEnvError(f"cannot connect to {self.ws_url}: {exc}; is the server running?") from None

    def _request(self, message: dict) -> dict:
        """Send one frame and read its reply; an error frame raises RemoteEnvError with the server's words.
        A tool call needs the connection its episode was reset on; anything else opens one when there is none."""
        # lazy: websockets is heavy or optional, loaded only when this runs
        from websockets.exceptions import ConnectionClosed
        if self._ws is None:
            if message["type"] == "step" and message["data"]["type"] == "call_tool":
                raise RemoteEnvError(f"no episode on {self.url}: the connection is closed or was never opened; "
                                     "call reset(task) first")
            self._ws = self._connect()
        try:
            try:
                self._ws.send(json.dumps(message))
            except ConnectionClosed:
                pass        # a refusing server (full, wrong key) sends its error frame and closes: read that
            reply = json.loads(self._ws.recv(timeout=self.timeout))
        except (ValueError, RecursionError):        # not JSON (JSONDecodeError is a ValueError)
            self.close()
            raise RemoteEnvError(f"{self.url} answered {message['type']} with a frame that is not JSON; the "
                                 "connection was dropped (is this an OpenEnv server?)") from None
        except TimeoutError:
            self.close()        # a late reply would pair with the next request: drop the connection
            raise RemoteEnvError(f"{self.url} did not answer {message['type']} within {self.timeout:g} s; the "
                                 "connection was dropped (the episode is lost): reset to start again") from None
        except ConnectionClosed as exc:
            self._ws = None
            raise RemoteEnvError(f"{self.url} closed the connection ({exc}); reset to start again") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("data") or {}, dict):
            self.close()
            raise RemoteEnvError(f"{self.url} answered {message['type']} with {str(reply)[:100]!r}, not an OpenEnv "
                                 "frame ({'type': ..., 'data': {...}}); the connection was dropped")
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            if data.get("code") in ("UNAUTHORIZED", "CAPACITY_REACHED", "FACTORY_ERROR"):
                self.close()
            raise RemoteEnvError(f"{self.url} refused {message['type']}: {data.get('message', 'unknown error')} "
                                 f"(code {data.get('code', 'UNKNOWN')})")
        return reply

    def _http(self, method: str, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=data,
                                         headers={**self.headers, "Content-Type": "application/json"})
        handlers = [urllib.request.ProxyHandler({})] if self._local else []
        try:
            with urllib.request.build_opener(*handlers).open(request, timeout=self.timeout) as response:
                text = response.read(self.max_message_bytes + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode(errors="replace")
            try:
                detail = json.loads(detail).get("detail", detail)
            except (ValueError, AttributeError):
                pass
            raise RemoteEnvError(f"{method} {self.url}{path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RemoteEnvError(f"cannot reach {self.url}{path}: {exc}; is the server running?") from None
        if len(text) > self.max_message_bytes:
            raise RemoteEnvError(f"{method} {self.url}{path}: the answer is over {self.max_message_bytes} bytes "
                                 "(RemoteEnv's max_message_bytes); is this an OpenEnv server?")
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise RemoteEnvError(f"{method} {self.url}{path}: the answer is not JSON: {text[:100]!r}; is this an "
                                 "OpenEnv server?") from None

    def _metadata(self) -> dict:
        try:
            meta = self._http("GET", "/metadata")
        except RemoteEnvError as exc:
            if "HTTP 404" in str(exc):          # an older server: fine, the caller's name/max_turns or defaults
                return {}
            raise
        return meta if isinstance(meta, dict) else {}

    def _task_api(self, method: str, route: str, body: dict | None = None) -> Any:
        if self._env_name is None:
            self._env_name = self._http("GET", "/list_environments")[0]
        try:
            return self._http(method, f"/{urllib.parse.quote(self._env_name)}/{route}", body)
        except RemoteEnvError as exc:
            if "HTTP 501" in str(exc) or "HTTP 404" in str(exc):
                raise RemoteEnvError(f"{exc}\n{self.url} does not list its tasks (OpenEnv's task API); make the "
                                     "Task objects yourself and pass them to reset()") from None
            raise


def task_from_spec(spec: Any, split: str, index: int) -> Task:
    """A task from OpenEnv's task API (any environment's spec) as a strop Task; its index is kept for reset."""
    if not isinstance(spec, dict):
        return Task(id=f"{split}-{index}", prompt=str(spec), answer="", split=split, meta={"index": index})
    meta = dict(spec.get("meta") or {})
    meta.update({k: v for k, v in spec.items() if k not in ("id", "task_id", "prompt", "answer", "split", "meta")})
    meta.setdefault("index", index)
    return Task(id=str(spec.get("id") or spec.get("task_id") or f"{split}-{index}"),
                prompt=str(spec.get("prompt") or spec.get("question") or ""), answer=str(spec.get("answer") or ""),
                split=str(spec.get("split") or split), meta=meta)


def observation_text(observation: dict) -> str:
    """What the model reads of an OpenEnv observation: strop's `content`, a tool's text, or the fields as JSON."""
    if isinstance(observation.get("content"), str):
        return observation["content"]
    if "tool_name" in observation:
        error = observation.get("error")
        if error:
            return f"error ({error.get('error_type', 'error')}): {error.get('message', '')}"
        return result_text(observation.get("result"))
    rest = {k: v for k, v in observation.items() if k not in ("metadata", "done", "reward")}
    return json.dumps(rest, default=str)


def result_text(result: Any) -> str:
    """A tool's result as text: MCP text content joined, else FastMCP's `data`, else JSON."""
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        texts = [c.get("text", "") for c in result.get("content") or []
                 if isinstance(c, dict) and c.get("type") == "text"]
        if texts:
            return "\n".join(texts)
        if "data" in result and result["data"] is not None:
            return result["data"] if isinstance(result["data"], str) else json.dumps(result["data"], default=str)
    return json.dumps(result, default=str)
