"""Fault injection on `strop serve`: loopback by default, a key when asked, size caps, garbage bodies. A bad
request gets a clear HTTP error and the server goes on serving."""

import json
import threading
import urllib.error
import urllib.request

import pytest

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
    request = urllib.request.Request(f"http://127.0.0.1:{srv.server_port}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


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
