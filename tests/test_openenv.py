"""OpenEnv interoperability both ways: a strop environment served over OpenEnv's protocol (driven here by the real
`openenv` package's clients and by strop's RemoteEnv), and bad input that must not take the server down.

The environment is a toy: add two numbers with the `add` tool, then `submit_answer` the sum (reward 1 if right).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from strop.envs.base import Environment, Observation, StepResult, Task, ToolCall
from strop.envs.openenv_client import RemoteEnv, RemoteEnvError
from strop.envs.openenv_server import serve_env

for _module in ("starlette", "uvicorn", "websockets"):
    pytest.importorskip(_module, reason="pip install 'strop[openenv]'")

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
SMALL = 8192                                   # the open server's message cap, so "too large" is cheap to send


class ArithEnv:
    """Add two numbers, then submit the sum."""

    name = "arith"
    max_turns = 4

    def __init__(self):
        self.task, self.calls, self.answer, self.done, self.closed = None, [], None, False, False

    def tools(self):
        ints = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]}
        answer = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        return [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ints}},
                {"type": "function", "function": {"name": "submit_answer", "description": "final answer",
                                                  "parameters": answer}},
                {"type": "function", "function": {"name": "boom", "description": "always fails",
                                                  "parameters": {"type": "object", "properties": {}}}},
                {"type": "function", "function": {"name": "wait", "description": "sleeps a while",
                                                  "parameters": {"type": "object", "properties": {}}}}]

    def splits(self):
        return ["train", "test"]

    def tasks(self, split, limit=None):
        tasks = [Task(f"{split}-{i}", f"What is {i} + {i + 2}?", str(2 * i + 2), split, {"i": i}) for i in range(5)]
        return tasks[:limit]

    def reset(self, task):
        self.task, self.calls, self.answer, self.done = task, [], None, False
        return Observation(f"{task.prompt} Use add, then submit_answer.", {"task": task.id})

    def step(self, call):
        self.calls.append(call.name)
        if call.name == "boom":
            raise ValueError("kaboom")
        if call.name == "wait":
            time.sleep(call.arguments.get("seconds", 1.0))
            return StepResult(Observation("waited"))
        if call.name == "echo":   # what a client sent back, with a number parsed from it (inf from "inf")
            return StepResult(Observation(str(call.arguments.get("text"))),
                              info={"parsed": float(call.arguments.get("x", 0))})
        if call.name == "add":
            return StepResult(Observation(str(call.arguments["a"] + call.arguments["b"])))
        if call.name == "submit_answer":
            self.answer, self.done = str(call.arguments.get("answer")), True
            correct = self.answer == self.task.answer
            return StepResult(Observation("correct" if correct else "wrong"), reward=float(correct), done=True,
                              info={"correct": correct})
        return StepResult(Observation(f"unknown tool {call.name!r}; the tools are add, submit_answer"))

    def state(self):
        return {"task_id": self.task.id, "turns": len(self.calls), "calls": list(self.calls), "answer": self.answer,
                "done": self.done}

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def keyed_server():
    server = serve_env(ArithEnv, port=0, api_key=KEY, block=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_server():
    server = serve_env(ArithEnv, port=0, max_message_bytes=SMALL, block=False)
    yield server
    server.stop()


def http(method, url, body=None, headers=None):
    """(status, JSON body) of one request, errors included."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                            **(headers or {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_passes_openenvs_own_runtime_validator(open_server):
    pytest.importorskip("openenv", reason="pip install openenv (the OpenEnv package)")
    from openenv.cli._validation import validate_running_environment  # what `openenv validate --url` runs

    report = validate_running_environment(open_server.url)
    assert report["passed"], report["summary"]
    assert report["mode"] == "production" and report["standard_profile"] == "openenv-http/1.x"
    status, schemas = http("GET", f"{open_server.url}/schema")
    assert status == 200 and {"action", "observation", "state", "reset_observation"} <= set(schemas)
    assert [a["properties"]["type"]["const"] for a in schemas["action"]["oneOf"]] == ["list_tools", "call_tool"]


def test_openenv_generic_client_runs_an_episode(keyed_server):
    pytest.importorskip("openenv", reason="pip install openenv (the OpenEnv package)")
    from openenv import GenericEnvClient

    with GenericEnvClient(base_url=keyed_server.url, headers=AUTH).sync() as env:
        first = env.reset(split="train", index=1)
        assert first.observation["task_id"] == "train-1" and "1 + 3" in first.observation["content"]
        assert first.done is False and first.reward is None
        tools = env.step({"type": "list_tools"}).observation["tools"]
        assert [t["name"] for t in tools] == ["add", "submit_answer", "boom", "wait"]
        assert tools[0]["input_schema"]["required"] == ["a", "b"]
        added = env.step({"type": "call_tool", "tool_name": "add", "arguments": {"a": 1, "b": 3}})
        assert added.observation["result"]["data"] == "4" and added.reward == 0.0 and added.done is False
        state = env.state()
        # OpenEnv's state contract (its runtime.state_contract grader) counts every step, list_tools too
        assert state["step_count"] == 2 and state["task_id"] == "train-1" and state["calls"] == ["add"]
        final = env.step({"type": "call_tool", "tool_name": "submit_answer", "arguments": {"answer": "4"}})
        assert final.reward == 1.0 and final.done is True and final.observation["info"] == {"correct": True}
        assert env.state()["answer"] == "4"


def test_openenv_mcp_tool_client_runs_an_episode(keyed_server):
    pytest.importorskip("openenv", reason="pip install openenv (the OpenEnv package)")
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    # MCPToolClient's production mode: an HTTP session (POST /mcp) that the WebSocket attaches to
    with MCPToolClient(base_url=keyed_server.url, headers=AUTH).sync() as env:
        first = env.reset(task_id="test-2")
        assert first.observation.task_id == "test-2" and "2 + 4" in first.observation.content
        tools = env.list_tools()
        assert [t.name for t in tools] == ["add", "submit_answer", "boom", "wait"]
        assert set(tools[0].input_schema["properties"]) == {"a", "b"}
        assert env.call_tool("add", a=2, b=4) == "6"
        with pytest.raises(RuntimeError, match="kaboom"):
            env.call_tool("boom")
        final = env.step(CallToolAction(tool_name="submit_answer", arguments={"answer": "6"}))
        assert final.reward == 1.0 and final.done is True
        state = env.state()
        assert state.step_count == 2 and state.episode_id
    until(lambda: not keyed_server.service.sessions)        # closing the client closed its session


def test_remote_env_is_a_strop_environment(keyed_server):
    with RemoteEnv(keyed_server.url, api_key=KEY, timeout=10) as env:
        assert isinstance(env, Environment) and env.name == "arith" and env.max_turns == 4
        assert env.splits() == ["train", "test"]
        tasks = env.tasks("train", limit=2)
        assert [t.id for t in tasks] == ["train-0", "train-1"] and tasks[1].meta["index"] == 1
        assert tasks[1].answer == ""                                 # gold answers stay on the server
        assert [t["function"]["name"] for t in env.tools()] == ["add", "submit_answer", "boom", "wait"]
        assert env.tools()[1]["function"]["parameters"]["required"] == ["answer"]
        assert "1 + 3" in env.reset(tasks[1]).content
        added = env.step(ToolCall("add", {"a": 1, "b": 3}, id="call-1"))
        assert (added.observation.content, added.reward, added.done) == ("4", 0.0, False)
        assert "unknown tool 'nope'" in env.step(ToolCall("nope", {})).observation.content
        failed = env.step(ToolCall("boom", {}))                      # a tool that raises is an observation
        assert "kaboom" in failed.observation.content and failed.info["toolError"]["error_type"] == "execution_error"
        final = env.step(ToolCall("submit_answer", {"answer": "4"}))
        assert (final.reward, final.done, final.info) == (1.0, True, {"correct": True})
        with pytest.raises(RemoteEnvError, match="episode is over"):
            env.step(ToolCall("add", {"a": 1, "b": 1}))
        state = env.state()
        assert state["answer"] == "4" and state["calls"] == ["add", "nope", "boom", "submit_answer"]
        env.reset(tasks[0])                                          # the next episode, same connection
        assert (env.state()["task_id"], env.state()["step_count"], env.state()["calls"]) == ("train-0", 0, [])
    with pytest.raises(RemoteEnvError, match="call reset"):
        env.step(ToolCall("add", {"a": 1, "b": 1}))


def test_bad_messages_get_clear_errors_and_the_session_survives(open_server):
    from websockets.sync.client import connect

    with connect(open_server.url.replace("http", "ws") + "/ws", proxy=None) as ws:
        def ask(frame):
            ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
            return json.loads(ws.recv(timeout=10))

        cases = [
            ("not json", "INVALID_JSON", "not JSON"),
            ([1, 2], "VALIDATION_ERROR", "string 'type'"),
            ({"type": "dance"}, "UNKNOWN_TYPE", "'dance'"),
            ({"type": "state", "extra": 1}, "VALIDATION_ERROR", "['extra']"),
            ({"type": "step", "data": {"type": "call_tool", "tool_name": "add"}}, "SESSION_ERROR", "reset"),
            ({"type": "step", "data": {"type": "call_tool"}}, "VALIDATION_ERROR", "'tool_name'"),
            ({"type": "step", "data": {"type": "jump"}}, "VALIDATION_ERROR", "list_tools"),
            ({"type": "step"}, "VALIDATION_ERROR", "'data'"),
            ({"type": "reset", "data": {"index": "3", "level": 3}}, "VALIDATION_ERROR", "'index' must be"),
            ({"type": "step", "data": {"type": "list_tools", "metadata": "x"}}, "VALIDATION_ERROR", "'metadata'"),
            ({"type": "step", "data": {"type": "call_tool", "tool_name": "add", "metadata": [1]}}, "VALIDATION_ERROR",
             "'metadata'"),
            ({"type": "reset", "data": {"index": -1}}, "VALIDATION_ERROR", "non-negative"),
            ({"type": "reset", "data": {"task_id": "nope"}}, "VALIDATION_ERROR", "no task 'nope'"),
            ({"type": "reset", "data": {"split": "dev"}}, "VALIDATION_ERROR", "the splits are"),
            ({"type": "reset", "data": {"split": "train", "index": 99}}, "VALIDATION_ERROR", "has 5 tasks"),
            ("x" * (SMALL + 1), "MESSAGE_TOO_LARGE", f"{SMALL} bytes"),
        ]
        for frame, code, words in cases:
            reply = ask(frame)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (frame, reply)
            assert words in reply["data"]["message"], (frame, reply)
        # the same connection still plays
        reset = ask({"type": "reset", "data": {"split": "train", "index": 0}})
        assert reset["data"]["observation"]["task_id"] == "train-0"
        assert ask(b'{"type": "state"}')["data"]["task_id"] == "train-0"          # binary frames work too
        done = ask({"type": "step", "data": {"type": "call_tool", "tool_name": "submit_answer",
                                             "arguments": {"answer": "2"}}})
        assert done["data"]["done"] is True and done["data"]["reward"] == 1.0
        again = ask({"type": "step", "data": {"type": "call_tool", "tool_name": "add", "arguments": {"a": 1, "b": 2}}})
        assert again["data"]["code"] == "SESSION_ERROR" and "episode is over" in again["data"]["message"]
        rpc = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 7}})
        assert rpc["data"]["id"] == 7 and rpc["data"]["result"]["tools"][0]["inputSchema"]["required"] == ["a", "b"]
        assert ask({"type": "mcp", "data": {"method": "x"}})["data"]["error"]["code"] == -32600

    url = open_server.url
    status, reply = http("POST", f"{url}/mcp", b"{oops")
    assert status == 200 and reply["error"]["code"] == -32700
    status, reply = http("POST", f"{url}/mcp", {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "add"},
                                                "id": 1})
    assert reply["error"]["code"] == -32602 and "openenv/session/create" in reply["error"]["message"]
    status, reply = http("POST", f"{url}/mcp", {"jsonrpc": "2.0", "method": "nope", "id": 2})
    assert reply["error"]["code"] == -32601 and "tools/list" in reply["error"]["message"]
    assert http("POST", f"{url}/mcp", {"pad": "x" * SMALL})[0] == 413
    status, reply = http("POST", f"{url}/arith/tasks", {})
    assert status == 400 and "'split'" in reply["detail"]
    assert http("POST", f"{url}/other/tasks", {"split": "train"})[0] == 404
    assert http("GET", f"{url}/health") == (200, {"status": "healthy"})


def test_replies_are_strict_json_and_a_websockets_session_is_its_own(open_server):
    """What OpenEnv's other clients (JavaScript, Go, Rust) and its runtime graders need: no Infinity or lone
    surrogate in a reply, unknown reset fields ignored as OpenEnv's server ignores them (and named), list_tools
    counted as a step with a number for its reward; and a WebSocket's session cannot be used or closed over HTTP
    by its id."""
    from websockets.sync.client import connect

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a reply: {text[:200]}"))

    with connect(open_server.url.replace("http", "ws") + "/ws", proxy=None) as ws:
        def ask(frame):
            ws.send(json.dumps(frame))
            return strict(ws.recv(timeout=10))

        reset = ask({"type": "reset", "data": {"split": "train", "index": 1, "options": {}, "seed": 4}})
        assert reset["data"]["observation"]["task_id"] == "train-1"
        assert reset["data"]["observation"]["metadata"]["ignored_reset_fields"] == ["options"]
        listed = ask({"type": "step", "data": {"type": "list_tools"}})
        assert listed["data"]["reward"] == 0.0 and ask({"type": "state"})["data"]["step_count"] == 1
        echo = ask({"type": "step", "data": {"type": "call_tool", "tool_name": "echo",
                                             "arguments": {"text": "a\ud800b", "x": "inf"}}})
        assert echo["data"]["observation"]["info"]["parsed"] is None
        assert echo["data"]["observation"]["result"]["data"] == "a\ufffdb"
        assert ask({"type": "state"})["data"]["step_count"] == 2
        own = ask({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}})
        sid = own["data"]["result"]["session_id"]
        for method, params in (("openenv/session/close", {"session_id": sid}),
                               ("tools/call", {"session_id": sid, "name": "add", "arguments": {"a": 1, "b": 2}})):
            status, reply = http("POST", f"{open_server.url}/mcp", {"jsonrpc": "2.0", "method": method,
                                                                    "params": params, "id": 2})
            assert status == 200 and "unknown session_id" in reply["error"]["message"], (method, reply)
        added = ask({"type": "step", "data": {"type": "call_tool", "tool_name": "add", "arguments": {"a": 1, "b": 2}}})
        assert added["data"]["observation"]["result"]["data"] == "3"            # the socket's session is intact

    status, made = http("POST", f"{open_server.url}/mcp", {"jsonrpc": "2.0", "method": "openenv/session/create",
                                                           "id": 3})
    sid = made["result"]["session_id"]
    with connect(open_server.url.replace("http", "ws") + f"/ws?session_id={sid}", proxy=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"index": 0}}))     # MCPToolClient's way: reset over its socket
        assert strict(ws.recv(timeout=10))["type"] == "observation"
    call = {"jsonrpc": "2.0", "method": "tools/call", "id": 4,
            "params": {"session_id": sid, "name": "echo", "arguments": {"text": "x", "x": "-inf"}}}
    request = urllib.request.Request(f"{open_server.url}/mcp", method="POST", data=json.dumps(call).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as response:
        assert response.status == 200          # was a 500: Starlette refuses to write Infinity
        assert strict(response.read().decode())["result"]["meta"]["info"]["parsed"] is None


def test_every_task_route_answers(open_server):
    url = f"{open_server.url}/arith"
    assert http("GET", f"{url}/splits") == (200, [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}])
    status, reply = http("POST", f"{url}/tasks", {"split": "train"})
    assert status == 200 and [t["id"] for t in reply["tasks"]] == [f"train-{i}" for i in range(5)]
    assert "answer" not in reply["tasks"][0] and reply["env_name"] == "arith"
    status, reply = http("POST", f"{url}/tasks", {"split": "train", "start": 3})
    assert status == 200 and [t["index"] for t in reply["tasks"]] == [3, 4]
    assert http("POST", f"{url}/num_tasks", {"split": "test"}) == (200, {"num_tasks": 5})
    status, reply = http("POST", f"{url}/task", {"split": "test", "index": 2})
    assert status == 200 and reply["task"]["id"] == "test-2" and "2 + 4" in reply["task"]["prompt"]
    status, reply = http("POST", f"{url}/task_range", {"split": "train", "start": 1, "stop": 3})
    assert status == 200 and [t["id"] for t in reply["tasks"]] == ["train-1", "train-2"]
    for route, body, words in (("task", {"split": "test", "index": 9}, "out of range"),
                               ("task", {"split": "test", "index": -1}, "non-negative"),
                               ("task", {"split": "test", "index": True}, "non-negative"),
                               ("task_range", {"split": "train", "start": "1"}, "integers or null"),
                               ("tasks", {"split": "dev"}, "unknown split")):
        status, reply = http("POST", f"{url}/{route}", body)
        assert status == 400 and words in reply["detail"], (route, body, reply)


def test_api_key_is_checked_and_the_server_keeps_serving(keyed_server):
    pytest.importorskip("openenv", reason="pip install openenv (the OpenEnv package)")
    from openenv import GenericEnvClient
    from websockets.sync.client import connect

    url = keyed_server.url
    status, reply = http("GET", f"{url}/schema")
    assert status == 401 and "needs an API key" in reply["detail"]
    status, reply = http("GET", f"{url}/schema", headers={"X-API-Key": "wrong"})
    assert status == 401 and "wrong API key" in reply["detail"]
    assert http("GET", f"{url}/schema", headers={"X-API-Key": KEY})[0] == 200
    assert http("GET", f"{url}/health")[0] == 200
    with connect(url.replace("http", "ws") + "/ws", proxy=None) as ws:
        refused = json.loads(ws.recv(timeout=10))
        assert refused["data"]["code"] == "UNAUTHORIZED"
    with pytest.raises(RemoteEnvError, match="HTTP 401.*wrong API key"):
        RemoteEnv(url, api_key="wrong")
    with pytest.raises(RuntimeError, match="UNAUTHORIZED"):
        with GenericEnvClient(base_url=url, headers={"Authorization": "Bearer wrong"}).sync() as env:
            env.reset()
    with RemoteEnv(url, api_key=KEY) as env:                        # and the right key still works
        assert env.reset(Task("train-0", "", "", "train")).content.startswith("What is 0 + 2?")


def test_concurrent_sessions_do_not_see_each_other(keyed_server):
    envs = [RemoteEnv(keyed_server.url, api_key=KEY) for _ in range(4)]
    tasks = envs[0].tasks("train")
    for env, task in zip(envs, tasks):
        env.reset(task)
    envs[0].step(ToolCall("submit_answer", {"answer": "2"}))
    state = envs[1].state()
    assert (state["task_id"], state["step_count"], state["calls"], state["done"]) == ("train-1", 0, [], False)
    live = [s.env for s in keyed_server.service.sessions.values()]
    assert len(live) == 4 and len({id(e) for e in live}) == 4             # one environment per connection

    def play(env, task, results):
        i = task.meta["i"]
        for _ in range(3):
            total = env.step(ToolCall("add", {"a": i, "b": i + 2})).observation.content
        results[task.id] = (env.step(ToolCall("submit_answer", {"answer": total})).reward, env.state())

    results = {}
    threads = [threading.Thread(target=play, args=(env, task, results)) for env, task in zip(envs[1:], tasks[1:])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(results) == ["train-1", "train-2", "train-3"]
    for task_id, (reward, state) in results.items():
        assert reward == 1.0 and state["task_id"] == task_id and state["step_count"] == 4
    for env in envs:
        env.close()
    until(lambda: not keyed_server.service.sessions and all(e.closed for e in live))


def test_a_full_server_refuses_clearly_and_recovers():
    server = serve_env(ArithEnv, port=0, max_sessions=1, block=False)
    try:
        task = Task("train-0", "", "", "train")
        first, second = RemoteEnv(server.url), RemoteEnv(server.url)
        first.reset(task)
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED"):
            second.reset(task)
        first.close()
        until(lambda: not server.service.sessions)
        assert "0 + 2" in second.reset(task).content
        second.close()
    finally:
        server.stop()


def test_a_slow_server_times_out_and_the_next_episode_starts_clean(open_server):
    env = RemoteEnv(open_server.url, timeout=0.3)
    task = env.tasks("test", limit=1)[0]
    env.reset(task)
    with pytest.raises(RemoteEnvError, match="did not answer step within 0.3 s"):
        env.step(ToolCall("wait", {"seconds": 1.0}))
    with pytest.raises(RemoteEnvError, match="call reset"):         # that episode is gone, not silently desynced
        env.step(ToolCall("add", {"a": 0, "b": 2}))
    env.reset(task)
    assert env.step(ToolCall("add", {"a": 0, "b": 2})).observation.content == "2"
    env.close()


def test_an_environment_that_cannot_be_made_is_reported_not_fatal():
    from websockets.sync.client import connect

    def broken():
        raise FileNotFoundError("no database at /nowhere.db")

    server = serve_env(broken, port=0, block=False)
    try:
        status, reply = http("GET", f"{server.url}/metadata")
        assert status == 503 and "could not make the environment: FileNotFoundError" in reply["detail"]
        with pytest.raises(RemoteEnvError, match="no database at /nowhere.db"):
            RemoteEnv(server.url)
        with connect(server.url.replace("http", "ws") + "/ws", proxy=None) as ws:
            assert json.loads(ws.recv(timeout=10))["data"]["code"] == "FACTORY_ERROR"
        assert http("GET", f"{server.url}/health") == (200, {"status": "healthy"})
        assert not server.service.sessions
    finally:
        server.stop()
