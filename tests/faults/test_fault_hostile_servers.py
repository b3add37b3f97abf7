"""Hostile input against the parts of strop that read text they did not write: the finance-sql answer parser and
SQL checks, the observations an environment hands a model, `strop serve` and `strop envs serve`. Each attack
costs bounded time and memory, and gets an error a person can act on."""

from __future__ import annotations

import json
import multiprocessing
import socket
import threading
import time
import urllib.request

import pytest
from loopback import post_json

from strop.envs.base import Observation, StepResult, Task, ToolCall
from strop.envs.finance_sql import FinanceSQLEnv, parse_answer
from strop.envs.openenv_client import RemoteEnv, RemoteEnvError
from strop.envs.openenv_server import serve_env

# ---- parsers of model text: adversarial strings under a time budget ----------------------------------------

ADVERSARIAL = {
    "spaces then x": " " * 400 + "x",                      # was ~51 s: adjacent \s* around optional groups
    "many spaces then x": " " * 20_000 + "x",
    "spaces between signs": "- " * 5_000 + "$" + " " * 5_000 + "x",
    "comma runs": "1," * 400_000,                           # was seconds: a copy of the rest per number
    "years only": "2020 " * 100_000,
    "units": "1 percentage " * 50_000,
    "exponents": "1e" * 100_000,
}


def _timed(fn, argument, results) -> None:
    started = time.perf_counter()
    try:
        fn(argument)
    except Exception:  # noqa: BLE001 - refused or not, only the time matters here
        pass
    results.put(time.perf_counter() - started)


def seconds_taken(fn, argument, give_up: float = 10.0) -> float:
    """How long fn(argument) ran, measured in a forked child that is killed after `give_up` seconds (so a
    regression to super-linear matching fails here instead of hanging the suite)."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_timed, args=(fn, argument, results))
    child.start()
    child.join(give_up)
    if child.is_alive():
        child.kill()
        child.join()
        return float("inf")
    return results.get(timeout=5)


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_the_answer_parser_takes_bounded_time(name):
    assert seconds_taken(parse_answer, ADVERSARIAL[name]) < 0.25


def test_answers_are_read_from_their_first_characters_only():
    assert parse_answer(" " * 50_000 + "12.5%").value == 12.5               # stripped before the cap
    assert parse_answer("x" * 5_000 + " 12.5") is None                       # past the cap: not read
    assert parse_answer(10 ** 400) is None and parse_answer("1e999") is None  # no infinite answers


def test_a_deeply_nested_line_typed_into_envs_try_is_refused():
    from strop.cli.envs import _parse_line
    started = time.perf_counter()
    with pytest.raises(ValueError, match="nests too deeply"):     # was a RecursionError traceback out of envs try
        _parse_line('{"a":' * 100_000)
    assert time.perf_counter() - started < 0.5


@pytest.fixture
def finance(tmp_path):
    env = FinanceSQLEnv(seed=0, db_dir=str(tmp_path))
    env.reset(env.tasks("train", 1)[0])
    yield env
    env.close()


def test_a_hostile_answer_is_scored_at_once(finance):
    assert seconds_taken(finance.step, ToolCall("submit_answer", {"answer": " " * 400 + "x"})) < 0.5
    result = finance.step(ToolCall("submit_answer", {"answer": " " * 400 + "x"}))
    assert result.done and result.reward == 0.0 and "contains no number" in result.observation.content


@pytest.mark.parametrize("query", [
    "SELECT " + ", ".join(["*"] * 55) + " FROM income_statement a, income_statement b, balance_sheet c",  # 1,925
                                                                            # columns x 50 rows
    "SELECT " + ", ".join(["randomblob(900000)"] * 60),                     # was 54 MB of cells in one row
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 50) "
    "SELECT n, printf('%.*c', 99999, 'x') FROM r",
])
def test_an_observation_is_bounded_whatever_the_query(finance, query):
    started = time.perf_counter()
    content = finance.step(ToolCall("run_sql", {"query": query})).observation.content
    assert time.perf_counter() - started < 3.0
    assert len(content) <= 16_000 + 300
    assert "truncated" in content or "only the first" in content or content.startswith("Error:"), content[:300]


def test_what_the_database_refuses_says_what_to_do(finance):
    wide = finance.step(ToolCall("run_sql", {"query": "SELECT " + ", ".join(["*"] * 55) + " FROM income_statement"}))
    assert wide.observation.content.startswith("Error: too many columns in the result (at most 64)")
    huge = finance.step(ToolCall("run_sql", {"query": "SELECT randomblob(200000)"}))
    assert huge.observation.content == "Error: a value in the result is over 100,000 bytes; select shorter values."
    rows = finance.step(ToolCall("run_sql", {"query": "SELECT printf('%.*c', 190, 'x'), printf('%.*c', 190, 'y') "
                                                      "FROM income_statement a, income_statement b, balance_sheet c"}))
    rows = rows.observation.content                                     # 50 rows of 383 characters
    assert len(rows) < 16_200 and "[output truncated at 16000 characters:" in rows


def test_tool_arguments_a_model_wrote_badly_are_observations(finance):
    for arguments, says in (("[" * 30_000, "not valid JSON"), ("{" + '"a": 1, ' * 200_000 + "}", "the limit is")):
        content = finance.step(ToolCall("run_sql", arguments)).observation.content
        assert content.startswith("Error:") and says in content and len(content) < 1_000
    content = finance.step(ToolCall("describe_table", {"table": "x" * 1_000_000})).observation.content
    assert content.startswith("Error: there is no table") and len(content) < 1_000
    assert len(json.dumps(finance.state())) < 200_000     # what rollouts keep of those calls (was 1.9 MB)


# ---- strop envs serve: slow, silent, idle and deep clients ---------------------------------------------------

def needs_openenv_extras() -> None:
    for module in ("starlette", "uvicorn", "websockets"):
        pytest.importorskip(module, reason="pip install 'strop[openenv]'")


def served(env, **kwargs):
    """`strop envs serve` in this process (started; `.stop()` it)."""
    needs_openenv_extras()
    return serve_env(env, block=False, **kwargs)


def connect(url: str, **kwargs):
    """A WebSocket client (the `websockets` package)."""
    needs_openenv_extras()
    from websockets.sync.client import connect as ws_connect
    return ws_connect(url, **kwargs)


class FloodEnv:
    """An environment that answers with far more text than any model should read, and a reward it names."""

    name, max_turns = "flood", 3

    def __init__(self, size: int = 5_000_000, reward: float = 0.0):
        self.size, self.reward = size, reward

    def tools(self):
        return [{"type": "function", "function": {"name": "look", "description": "look around",
                                                  "parameters": {"type": "object", "properties": {}}}}]

    def splits(self):
        return ["train"]

    def tasks(self, split, limit=None):
        return [Task(f"flood-{i}", "Look around.", "0", "train", {"index": i}) for i in range(2)][:limit]

    def reset(self, task):
        return Observation("r" * self.size)

    def step(self, call):
        return StepResult(Observation("s" * self.size), reward=self.reward, done=False)

    def state(self):
        return {}

    def close(self):
        pass


def ws_url(server) -> str:
    return server.url.replace("http", "ws") + "/ws"


@pytest.fixture
def finance_server():
    server = served("finance-sql", port=0, options={"seed": 0}, read_timeout_s=1.0)
    yield server
    server.stop()


def health_seconds(server) -> float:
    started = time.perf_counter()
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{server.url}/health", timeout=30) as r:
        assert r.status == 200
    return time.perf_counter() - started


def test_a_hostile_answer_does_not_freeze_the_env_server(finance_server):
    with connect(ws_url(finance_server), proxy=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"split": "train", "index": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        started = time.perf_counter()
        ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "submit_answer",
                                                     "arguments": {"answer": " " * 400 + "x"}}}))
        health = health_seconds(finance_server)                          # asked while the answer is scored
        reply = json.loads(ws.recv(timeout=60))
        assert time.perf_counter() - started < 2.0 and health < 1.0     # was ~51 s for both
        assert reply["data"]["done"] is True and reply["data"]["reward"] == 0.0


def test_slow_and_silent_http_clients_are_dropped_while_others_are_served(finance_server):
    port = int(finance_server.url.rsplit(":", 1)[1])
    silent = socket.create_connection(("127.0.0.1", port))
    slow = socket.create_connection(("127.0.0.1", port))
    started = time.perf_counter()
    dropped = {}

    sender = slowloris(slow, started, dropped)
    assert health_seconds(finance_server) < 1.0                          # others are served meanwhile
    silent.settimeout(10)
    assert silent.recv(1) == b""                                          # closed by the server, not by us
    dropped["silent"] = time.perf_counter() - started
    sender.join(30)
    silent.close()
    slow.close()
    assert dropped["silent"] < 3.0 and dropped["slow"] is not None and dropped["slow"] < 4.0, dropped


def test_a_body_that_never_arrives_gets_408(finance_server):
    port = int(finance_server.url.rsplit(":", 1)[1])
    started = time.perf_counter()
    reply = raw_exchange(port, b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b'Content-Length: 100\r\n\r\n{"jsonrpc": ', timeout=10)
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply
    assert time.perf_counter() - started < 5.0                          # answered, then the connection closed


def test_idle_sessions_are_closed_and_a_new_client_gets_in():
    server = served(FloodEnv, port=0, max_sessions=2, session_idle_s=1.0)
    try:
        idle = [connect(ws_url(server), proxy=None).__enter__() for _ in range(2)]       # connect, then say nothing
        status, made = post_json(int(server.url.rsplit(":", 1)[1]),
                                 json.dumps({"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1}).encode(),
                                 key=None, path="/mcp")
        assert made["error"]["code"] == -32000 and "--max-sessions" in made["error"]["message"]
        assert "--session-idle-timeout" in made["error"]["message"]
        with connect(ws_url(server), proxy=None) as third:
            refused = json.loads(third.recv(timeout=10))
            assert refused["data"]["code"] == "CAPACITY_REACHED" and "--max-sessions" in refused["data"]["message"]
        for ws in idle:                                                   # each idle client is told, then closed
            told = json.loads(ws.recv(timeout=10))
            assert told["data"]["code"] == "SESSION_IDLE" and "--session-idle-timeout" in told["data"]["message"]
            ws.close()
        env = RemoteEnv(server.url, timeout=10)
        assert env.reset(env.tasks("train", 1)[0]).content.startswith("r")
        status, made = post_json(int(server.url.rsplit(":", 1)[1]),
                                 json.dumps({"jsonrpc": "2.0", "method": "openenv/session/create", "id": 2}).encode(),
                                 key=None, path="/mcp")
        assert made["result"]["session_id"] in server.service.sessions   # an HTTP-made session, then left idle
        deadline = time.monotonic() + 5
        while made["result"]["session_id"] in server.service.sessions and time.monotonic() < deadline:
            time.sleep(0.1)
        assert made["result"]["session_id"] not in server.service.sessions  # reaped with no new client asking
        env.close()
    finally:
        server.stop()


def test_deep_json_and_huge_names_get_short_clear_errors(finance_server):
    port = int(finance_server.url.rsplit(":", 1)[1])
    status, reply = post_json(port, b"[" * 200_000, key=None, path="/mcp")
    assert status == 200 and reply["error"]["code"] == -32700 and "nests too deeply" in reply["error"]["message"]
    with connect(ws_url(finance_server), proxy=None) as ws:
        for frame, code in (("[" * 200_000, "INVALID_JSON"), (json.dumps({"type": "x" * 900_000}), "UNKNOWN_TYPE"),
                            (json.dumps({"type": "state", "y" * 900_000: 1}), "VALIDATION_ERROR")):
            ws.send(frame)
            reply = ws.recv(timeout=10)
            assert json.loads(reply)["data"]["code"] == code and len(reply) < 1_000, reply[:200]


# ---- what a model reads of any environment, and what a client takes from any server --------------------------

def test_a_huge_observation_reaches_the_model_cut_with_a_marker(tiny_model_dir):
    import strop
    from strop import model_info
    from strop.renderers import get_renderer
    from strop.rl.episodes import OBSERVATION_CHARS, ToolEpisode
    from strop.rl.rollouts import play
    from strop.tokenizer_utils import get_tokenizer

    server = served(FloodEnv, port=0)                    # 5 MB a reset, 5 MB a step
    try:
        env = RemoteEnv(server.url, timeout=30)
        model = str(tiny_model_dir)
        sampler = strop.ServiceClient().create_sampling_client(base_model=model)
        renderer = get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(model))
        [task] = env.tasks("train", 1)
        [[episode]] = play(sampler, renderer, [[ToolEpisode(env, task)]], max_tokens=2, max_turns=1, seed=0)
        first = episode.messages[0]["content"]
        assert len(first) < OBSERVATION_CHARS + 100 and "observation truncated: 5,000,000 characters" in first
        assert episode.turns[0].prompt.length < 2 * OBSERVATION_CHARS         # what the sampler was given
        playing = ToolEpisode(env, task)
        playing.start()
        seen = playing.act('<tool_call>{"name": "look", "arguments": {}}</tool_call>')
        assert len(seen) < OBSERVATION_CHARS + 100 and seen.endswith("only the first 16,000 shown]")
        env.close()
    finally:
        server.stop()


def test_a_server_sending_a_nan_reward_is_refused():
    server = served(lambda: FloodEnv(size=10, reward=float("nan")), port=0)
    try:
        with RemoteEnv(server.url, timeout=10) as env:
            env.reset(env.tasks("train", 1)[0])
            with pytest.raises(RemoteEnvError, match="reward nan, which is not a finite number"):
                env.step(ToolCall("look", {}))
    finally:
        server.stop()


def test_a_server_answering_with_megabytes_is_refused():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from loopback import send_json

    class Flood(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            send_json(self, 200, {"name": "x" * 8_000_000})

    flood = ThreadingHTTPServer(("127.0.0.1", 0), Flood)
    threading.Thread(target=flood.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RemoteEnvError, match="over 1048576 bytes"):
            RemoteEnv(f"http://127.0.0.1:{flood.server_port}", max_message_bytes=1 << 20)
    finally:
        flood.shutdown()
        flood.server_close()


# ---- strop serve: lying headers, bad parameters, huge prompts, clients that leave or dawdle ------------------

@pytest.fixture(scope="module")
def model_server(tiny_model_dir):
    from strop.serve import make_server
    srv = make_server(str(tiny_model_dir), port=0, name="tiny", read_timeout=1.0, idle_timeout=1.0, max_connections=6)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def raw_exchange(port: int, head: bytes, timeout: float = 5.0) -> bytes:
    """What the server answers to `head` (request line and headers, maybe the start of a body), read until it
    closes or `timeout` passes."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head)
        sock.settimeout(timeout)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:                                  # timed out (no close), or reset after the answer
            pass
        return answer


def chat(srv, body: dict | bytes, timeout: float = 60) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return post_json(srv.server_port, data, key=None)


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("headers, status, says", [
    (b"Content-Length: -1\r\n", 400, "not a byte count"),                # was read to EOF: 300 MB into memory
    (b"Content-Length: abc\r\n", 400, "not a byte count"),               # was an unanswered ValueError
    (b"Content-Length: 10\r\nContent-Length: 20\r\n", 400, "not a byte count"),
    (b"", 411, "needs a Content-Length"),                                 # was taken as an empty body
    (b"Transfer-Encoding: chunked\r\n", 411, "chunked transfer encoding is not supported"),
    (b"Content-Length: 300000000\r\n", 413, "over the limit of 1048576"),
    (b"Content-Length: 99999999999999999999999\r\n", 400, "not a byte count"),
])
def test_a_lying_content_length_is_refused_before_any_body_is_read(model_server, headers, status, says):
    started = time.perf_counter()
    answer = raw_exchange(model_server.server_port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                    b"Content-Type: application/json\r\n" + headers + b"\r\n")
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]
    assert says.encode() in answer and b"Connection: close" in answer
    assert time.perf_counter() - started < 1.0                            # answered at once, nothing read
    assert chat(model_server, {"messages": HI, "max_tokens": 2})[0] == 200


@pytest.mark.parametrize("field, value, says", [
    ("temperature", float("nan"), "finite number between 0 and 2"),       # was accepted
    ("temperature", float("inf"), "finite number between 0 and 2"),       # was accepted
    ("temperature", -0.5, "finite number between 0 and 2"),               # was a 500
    ("temperature", "0.7", "must be a number"),                           # was read as 0.7
    ("top_p", float("nan"), "greater than 0 and at most 1"),              # was a 500
    ("top_p", 0, "greater than 0 and at most 1"),
    ("max_tokens", 0, "at least 1"),                                      # was quietly 256
    ("max_tokens", 2.5, "must be an integer"),
    ("max_completion_tokens", True, "must be an integer"),
    ("n", 0, "at least 1"),                                               # was quietly 1
    ("n", 17, "between 1 and 16"),
    ("seed", "x", "must be an integer"),
    ("stop", ["a", "b", "c", "d", "e"], "at most 4"),
    ("stop", [""], "non-empty"),
    ("stream", True, "not supported"),
    ("messages", [{"role": 1}], "non-empty list"),
    ("messages", [{"role": "user", "content": {"a": 1}}], "string or a list"),
])
def test_every_sampling_parameter_is_checked_and_named(model_server, field, value, says):
    status, reply = chat(model_server, {"messages": HI, "max_tokens": 2, field: value})
    assert status == 400 and says in reply["error"]["message"], reply
    assert reply["error"]["param"] == field or reply["error"]["param"].startswith(field), reply


@pytest.mark.parametrize("body, says", [(b"[]", "must be a JSON object"), (b'"hi"', "must be a JSON object"),
                                        (b"[" * 100_000, "nests too deeply")])
def test_a_body_that_is_not_a_request_is_a_400(model_server, body, says):
    status, reply = chat(model_server, body)                              # [] was a 500 AttributeError
    assert status == 400 and says in reply["error"]["message"], reply


def test_the_real_client_gets_the_field_named(model_server):
    from openai import BadRequestError, OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{model_server.server_port}/v1", api_key="unused", max_retries=0)
    with pytest.raises(BadRequestError, match="'temperature' must be a finite number between 0 and 2"):
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=2, temperature=-1)
    with pytest.raises(BadRequestError, match="'n' must be at least 1"):
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=2, n=0)


def test_a_prompt_over_the_context_is_refused_at_once(model_server, tiny_model_dir):
    status, reply = chat(model_server, {"messages": [{"role": "user", "content": "a" * 3_000}], "max_tokens": 2})
    assert status == 400 and reply["error"]["param"] == "messages"        # was run past the model's context
    assert "over this server's limit of 2048 (the model's context of 2048 tokens)" in reply["error"]["message"]
    started = time.perf_counter()                                         # the 900 kB message
    status, reply = chat(model_server, {"messages": [{"role": "user", "content": "hello " * 150_000}]})
    assert status == 400 and "the prompt is" in reply["error"]["message"]
    assert time.perf_counter() - started < 5.0                            # was 8+ minutes at 100% CPU
    from strop.serve import make_server
    small = make_server(str(tiny_model_dir), port=0, max_prompt_tokens=50)
    threading.Thread(target=small.serve_forever, daemon=True).start()
    try:
        status, reply = chat(small, {"messages": [{"role": "user", "content": "a " * 100}], "max_tokens": 2})
        assert status == 400 and "limit of 50 (--max-prompt-tokens)" in reply["error"]["message"]
        assert chat(small, {"messages": HI, "max_tokens": 2})[0] == 200
    finally:
        small.shutdown()
        small.server_close()


def test_a_client_that_leaves_stops_its_generation(model_server):
    long = json.dumps({"messages": [{"role": "user", "content": "hello world " * 30}], "max_tokens": 4096, "n": 16,
                       "temperature": 1.0}).encode()
    leaver = socket.create_connection(("127.0.0.1", model_server.server_port))
    leaver.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(long)).encode() + b"\r\n\r\n" + long)
    time.sleep(1.0)                                  # 16 x ~1,900 tokens (to the 2,048 context): seconds of work
    assert model_server.turns.busy                                        # it is generating
    leaver.close()                                                        # the client gives up
    started = time.perf_counter()
    status, reply = chat(model_server, {"messages": HI, "max_tokens": 2})
    assert status == 200 and time.perf_counter() - started < 3.0          # was served after the whole 16 x 4,096
    assert not model_server.turns.busy


def test_slow_idle_and_surplus_clients_are_dropped_while_others_are_served(model_server):
    port = model_server.server_port
    started = time.perf_counter()
    silent = socket.create_connection(("127.0.0.1", port))                # opens, then says nothing
    slow = socket.create_connection(("127.0.0.1", port))
    dropped = {}

    sender = slowloris(slow, started, dropped)
    assert chat(model_server, {"messages": HI, "max_tokens": 2})[0] == 200   # others are served meanwhile
    silent.settimeout(10)
    assert silent.recv(1) == b""                                          # closed by the server
    dropped["silent"] = time.perf_counter() - started
    sender.join(30)
    silent.close()
    slow.close()
    assert dropped["silent"] < 3.0 and dropped["slow"] is not None and dropped["slow"] < 4.0, dropped
    # past max_connections (6), a new connection is answered 503 at once; once the idle ones go, all is well
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
    time.sleep(0.2)
    answer = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=2)
    assert answer.startswith(b"HTTP/1.1 503") and b"its limit" in answer
    time.sleep(1.5)
    assert chat(model_server, {"messages": HI, "max_tokens": 2})[0] == 200
    for sock in idle:
        sock.close()


def test_a_schema_too_costly_to_compile_is_refused(model_server):
    many = {"type": "object", "properties": {f"{i:x}": {} for i in range(700)}}        # 7 kB, compiled in ~0.5 s
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4_000)}}  # was 37 s
    for schema, says in ((many, "an object of 700 properties; the limit is 128"), (big, "the limit is 16384")):
        started = time.perf_counter()
        status, reply = chat(model_server, {"messages": HI, "max_tokens": 2, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        assert status == 400 and says in reply["error"]["message"] and reply["error"]["param"] == "response_format"
        assert time.perf_counter() - started < 1.0
    status, reply = chat(model_server, {"messages": HI, "max_tokens": 4, "response_format": {"type": "json_object"}})
    assert status == 200


def test_rubrics_leave_out_what_a_remote_state_cannot_mean():
    from strop.envs.rubrics import rubric_metrics
    states = [{"turns": 2, "correct": True}, {"turns": 10 ** 400, "correct": False},          # was OverflowError
              {"turns": float("nan"), "sqlErrors": "x"}, {"turns": float("inf")}]               # was a NaN mean
    assert rubric_metrics(states) == {"rubric/turns": 2.0, "rubric/correct": 0.5}


def slowloris(sock, started: float, dropped: dict) -> threading.Thread:
    """Send a request head one byte every 0.2 s on `sock`; dropped["slow"] becomes the seconds after `started`
    at which the server cut it off (None if it never did)."""
    def trickle():
        try:
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
            dropped["slow"] = None
        except OSError:
            dropped["slow"] = time.perf_counter() - started
    sender = threading.Thread(target=trickle)
    sender.start()
    return sender
