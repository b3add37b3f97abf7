"""`strop serve` shared by several clients and reached by web pages: a json_schema request stops when its client
goes, one client's many generations do not starve another's, and a foreign page (CSRF, DNS rebinding) is refused
before anything runs. The tiny model on loopback, real sockets."""

import json
import socket
import threading
import time

import pytest
from loopback import post_json

from strop.serve import make_server

# the tiny model writes strings for as long as it is let (at temperature 1, and greedy: spaces)
STRINGS = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
    "type": "array", "items": {"type": "string"}, "minItems": 300}}}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def shared(tiny_model_dir):
    srv = make_server(str(tiny_model_dir), port=0, name="tiny", allowed_origins=("http://my-ui.example:3000",))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def send(port: int, body: dict, headers: bytes = b"Content-Type: application/json\r\n",
         host: bytes = b"127.0.0.1") -> socket.socket:
    """A connection that has sent one chat completion request (its answer left unread)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + b":" + str(port).encode() + b"\r\n"
                 + headers + b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return sock


def answer(sock: socket.socket, timeout: float = 10) -> bytes:
    """The answer's head and body (the server closes a refused connection; a served one is read to its body)."""
    sock.settimeout(timeout)
    data = b""
    with sock:
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def _length(data: bytes) -> int:
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    return next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")), 0)


def short(srv) -> tuple[int, float]:
    started = time.perf_counter()
    status, _ = post_json(srv.server_port, json.dumps({"messages": HI, "max_tokens": 2}).encode(), key=None)
    return status, time.perf_counter() - started


def test_grammar_requests_run_in_chunks_that_continue_the_grammar(shared):
    # a json_schema request now runs in chunks like any other (64 tokens, then 256): greedy tokens are those of one
    # pass, and a sample that ends past the first chunk is still JSON of the schema
    from strop import types
    from strop.serve.generation import generate
    prompt = shared.renderer.build_generation_prompt(HI)
    decode, stops = shared.renderer.tokenizer.decode, shared.renderer.get_stop_sequences()
    schema = STRINGS["json_schema"]["schema"]
    greedy = types.SamplingParams(max_tokens=400, temperature=0.0, json_schema=schema, stop=stops)
    whole = shared.sampler.sample(prompt=prompt, num_samples=2, sampling_params=greedy).result().sequences
    chunked = generate(shared.sampler, prompt, 2, greedy, decode, lambda: False)
    assert [s.tokens for s in chunked] == [s.tokens for s in whole] and len(whole[0].tokens) == 400
    thirty = {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 30, "maxItems": 30}
    seeded = types.SamplingParams(max_tokens=400, temperature=1.0, seed=3, json_schema=thirty, stop=stops)
    for seq in generate(shared.sampler, prompt, 2, seeded, decode, lambda: False):
        assert seq.stop_reason == "stop" and len(seq.tokens) > 64
        message, _ = shared.renderer.parse_response(seq.tokens)
        value = json.loads(message["content"], strict=False)   # xgrammar lets control characters into strings
        assert len(value) == 30 and all(isinstance(s, str) and len(s) <= 4 for s in value)
    prose = shared.renderer.tokenizer.encode("hello", add_special_tokens=False)     # not the start of an array
    with pytest.raises(ValueError, match="does not follow its json_schema"):
        shared.sampler.sample(prompt=prompt.append(types.EncodedTextChunk(tokens=prose)), sampling_params=greedy,
                              resumed=len(prose)).result()


def test_an_abandoned_json_schema_request_frees_the_engine(shared):
    leaver = send(shared.server_port, {"messages": [{"role": "user", "content": "hello world " * 30}],
                                       "max_tokens": 4096, "n": 16, "temperature": 1.0, "response_format": STRINGS})
    time.sleep(1.0)                                 # 16 x ~1,850 tokens of strings: many seconds of work
    assert shared.turns.busy
    leaver.close()                                  # the client gives up
    status, seconds = short(shared)
    assert status == 200 and seconds < 5.0, seconds  # was served after all of it (it ran whole, unwatched)


def test_one_client_with_six_generations_does_not_starve_another(shared):
    # six connections from one client, each a greedy generation to the context (the tiny model's greedy text never
    # ends): with one lock, another client's short request waited for all six; in turns, for one chunk of them
    long = {"messages": [{"role": "user", "content": "hello world " * 30}], "max_tokens": 4096, "n": 2,
            "temperature": 0}
    hog = [send(shared.server_port, long) for _ in range(6)]
    try:
        time.sleep(1.0)
        assert shared.turns.busy and shared.turns.waiting >= 4
        status, seconds = short(shared)
        assert status == 200 and seconds < 10.0, seconds
    finally:
        for sock in hog:
            sock.close()
    deadline = time.monotonic() + 30                 # they leave within a chunk each
    while (shared.turns.busy or shared.turns.waiting) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not shared.turns.busy and not shared.turns.waiting


@pytest.mark.parametrize("headers, host, status, says", [
    # a page on another site POSTing text/plain (no preflight): CSRF
    (b"Content-Type: text/plain\r\nOrigin: http://evil.example\r\n", b"127.0.0.1", 403, b"web pages at"),
    # DNS rebinding: the page's own name, now pointing at 127.0.0.1
    (b"Content-Type: application/json\r\n", b"evil.example", 403, b"is not this machine"),
    (b"Content-Type: application/json\r\nOrigin: null\r\n", b"127.0.0.1", 403, b"web pages at"),
    (b"Content-Type: text/plain\r\n", b"127.0.0.1", 415, b"Content-Type: application/json"),
    (b"", b"localhost", 415, b"sent none"),
    (b"Content-Type: application/json\r\nOrigin: http://localhost:5173\r\n", b"localhost", 200, b"chat.completion"),
    (b"Content-Type: application/json; charset=utf-8\r\nOrigin: http://my-ui.example:3000\r\n", b"[::1]", 200,
     b"chat.completion"),
])
def test_web_pages_and_foreign_hosts_are_refused_before_anything_runs(shared, headers, host, status, says):
    started = time.perf_counter()
    reply = answer(send(shared.server_port, {"messages": HI, "max_tokens": 2}, headers=headers, host=host))
    assert reply.startswith(f"HTTP/1.1 {status}".encode()) and says in reply, reply[:300]
    assert time.perf_counter() - started < 5.0


def test_a_rebound_page_cannot_read_the_models_either(shared):
    sock = socket.create_connection(("127.0.0.1", shared.server_port))
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 403") and b"tiny" not in reply


def test_the_guards_read_hosts_and_origins_as_browsers_send_them():
    from strop.serve.guard import host_problem, origin_problem
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000", "127.1.2.3", "app.localhost:80"):
        assert host_problem(host, "127.0.0.1") is None, host
    for host in ("evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example", "[::1", "a b", ""):
        assert host_problem(host, "127.0.0.1") is not None, host
    assert host_problem("anything.example", "0.0.0.0") is None          # bound wider: reached by any name
    assert origin_problem("http://10.0.0.5:8000", "10.0.0.5:8000", frozenset()) is None   # the server's own page
    assert origin_problem("http://10.0.0.6:8000", "10.0.0.5:8000", frozenset()) is not None
    assert origin_problem("http://[::1", "x", frozenset()) is not None   # malformed: refused, not a 500
