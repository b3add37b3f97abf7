"""Fault injection on `strop serve`: loopback by default, a key when asked, size caps, garbage bodies. A bad
request gets a clear HTTP error and the server goes on serving."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from loopback import post_json
from test_control import home, run  # noqa: F401 - the fixture and the CLI runner of the control-plane tests

from strop.cli.main import build_parser
from strop.serve import make_server


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    srv = make_server(str(tiny_model_dir), port=0, name="tiny", api_key="sekret", max_body=2048)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def post(srv, body: bytes, key: str | None = "sekret", path: str = "/v1/chat/completions"):
    return post_json(srv.server_port, body, key, path)


def test_loopback_unless_told_otherwise(server):
    assert server.server_address[0] == "127.0.0.1"
    args = build_parser().parse_args(["serve", "strop/tiny-random"])
    assert args.host == "127.0.0.1"


def test_hostile_requests_get_clear_errors_and_the_server_goes_on(server):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    cases = [(post(server, good, key=None), 401), (post(server, good, key="wrong"), 401),
             (post(server, b"{not json"), 400), (post(server, b"x" * 4096), 413),
             (post(server, json.dumps({"messages": "hi"}).encode()), 400),
             (post(server, json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}).encode()), 400),
             (post(server, json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                       "response_format": {"type": "xml"}}).encode()), 400),
             (post(server, good, path="/v1/admin"), 404)]
    for (status, body), expected in cases:
        assert status == expected and body["error"]["message"], (status, body)
    status, body = post(server, good)
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"


# ---- the real commands, as a person starts them --------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening_on(port: int) -> set[str]:
    """The addresses a socket listens on at `port`, from /proc/net/tcp (IPv4, as hex little-endian)."""
    found = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def _start(argv: list[str], port: int, health: str, key: str | None = None, timeout: float = 120):
    env = {**os.environ, **({"SERVE_KEY": key} if key else {})}
    proc = subprocess.Popen([sys.executable, "-m", "strop.cli.main", *argv, "--port", str(port),
                             *(["--api-key-env", "SERVE_KEY"] if key else [])],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=5).close()
            return proc
        except urllib.error.HTTPError:  # answered (401 without the key): it is up
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{argv} did not start: {proc.stderr.read().decode()}")
            time.sleep(0.3)


def _stop(proc) -> str:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.stderr.read().decode()


def _warning_of(argv: list[str]) -> str:
    """stderr up to the 'serving' line of a command bound beyond loopback (stopped as soon as it says it)."""
    proc = subprocess.Popen([sys.executable, "-m", "strop.cli.main", *argv, "--port", str(_free_port())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "serving" in line or "warning" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    return "".join(lines)


@pytest.fixture()
def tiny_selected(home, capsys):  # noqa: F811
    assert run(capsys, "base-models", "select", "strop/tiny-random", "--wait")[0] == 0


def test_strop_serve_as_a_user_starts_it(tiny_selected):
    from openai import AuthenticationError, BadRequestError, OpenAI
    port = _free_port()
    proc = _start(["serve", "strop/tiny-random", "--max-tokens-limit", "8", "--max-body-bytes", "4096",
                   "--max-prompt-tokens", "64", "--idle-timeout", "1"], port, "/health", key="sekret")
    try:
        assert _listening_on(port) == {"127.0.0.1"}
        url = f"http://127.0.0.1:{port}/v1"
        for key in ("wrong", "unused"):
            with pytest.raises(AuthenticationError):
                OpenAI(base_url=url, api_key=key, max_retries=0).models.list()
        status, _ = post_json(port, json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), key=None)
        assert status == 401
        client = OpenAI(base_url=url, api_key="sekret", max_retries=0)
        reply = client.chat.completions.create(model="strop/tiny-random", max_tokens=4,
                                               messages=[{"role": "user", "content": "What is 1 + 1?"}])
        assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens <= 4
        with pytest.raises(BadRequestError, match="over this server's limit of 8"):
            client.chat.completions.create(model="strop/tiny-random", max_tokens=9,
                                           messages=[{"role": "user", "content": "hi"}])
        status, body = post_json(port, b"x" * 8192, key="sekret")
        assert status == 413 and "over the limit of 4096" in body["error"]["message"]
        with pytest.raises(BadRequestError, match=r"limit of 64 \(--max-prompt-tokens\)"):
            client.chat.completions.create(model="strop/tiny-random", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi " * 100}])
        with socket.create_connection(("127.0.0.1", port)) as idle:     # --idle-timeout 1: dropped, not kept
            idle.settimeout(10)
            assert idle.recv(1) == b""
        assert client.models.list().data[0].id == "strop/tiny-random"  # still serving after every refusal
    finally:
        err = _stop(proc)
    assert "warning" not in err


def test_strop_serve_warns_when_exposed_without_a_key_and_names_its_argument(tiny_selected, capsys):
    assert "warning: listening on 0.0.0.0" in _warning_of(["serve", "strop/tiny-random", "--host", "0.0.0.0"])
    code, _, err = run(capsys, "serve", "model-nope")
    assert code == 1 and "MODEL 'model-nope'" in err and "--model" not in err
    code, _, err = run(capsys, "serve", "strop/tiny-random", "--max-tokens-limit", "0")
    assert code == 1 and "--max-tokens-limit must be at least 1" in err
    code, _, err = run(capsys, "serve", "strop/tiny-random", "--read-timeout", "nan")
    assert code == 1 and "--read-timeout must be a positive number of seconds" in err
    code, _, err = run(capsys, "serve", "strop/tiny-random", "--allow-origin", "my-ui.example/app")
    assert code == 1 and "--allow-origin 'my-ui.example/app': give a web page's origin" in err


def test_strop_envs_serve_as_a_user_starts_it():
    from websockets.sync.client import connect
    port = _free_port()
    proc = _start(["envs", "serve", "finance-sql", "--max-message-bytes", "4096", "--max-sessions", "1",
                   "--session-idle-timeout", "1"], port, "/health", key="sekret")
    try:
        assert _listening_on(port) == {"127.0.0.1"}
        schema = f"http://127.0.0.1:{port}/schema"
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(schema, headers=headers), timeout=10)
            assert refused.value.code == 401
        with urllib.request.urlopen(urllib.request.Request(schema, headers={"Authorization": "Bearer sekret"}),
                                    timeout=10) as reply:
            assert reply.status == 200
        request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=b"x" * 8192, method="POST",
                                         headers={"Authorization": "Bearer sekret",
                                                  "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 413
        ws, auth = f"ws://127.0.0.1:{port}/ws", {"Authorization": "Bearer sekret"}
        with connect(ws, additional_headers=auth, proxy=None) as idle:   # holds the one session, says nothing
            idle.send(json.dumps({"type": "state"}))
            idle.recv(timeout=10)
            with connect(ws, additional_headers=auth, proxy=None) as second:
                refused = json.loads(second.recv(timeout=10))["data"]
                assert refused["code"] == "CAPACITY_REACHED" and "--max-sessions" in refused["message"]
            assert json.loads(idle.recv(timeout=10))["data"]["code"] == "SESSION_IDLE"   # after 1 s of nothing
        with connect(ws, additional_headers=auth, proxy=None) as third:                 # now there is room
            third.send(json.dumps({"type": "reset", "data": {"split": "train", "index": 0}}))
            assert json.loads(third.recv(timeout=10))["type"] == "observation"
    finally:
        err = _stop(proc)
    assert "warning" not in err
    assert "warning: listening on 0.0.0.0" in _warning_of(["envs", "serve", "finance-sql", "--host", "0.0.0.0"])
