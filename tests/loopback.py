"""Small pieces the tests share for OpenAI-style HTTP on loopback: a chat completion body, a JSON reply from a
BaseHTTPRequestHandler, a POST that returns (status, JSON) even for error statuses, and a port nothing uses."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request


def chat_completion(model: str, message: dict, finish_reason: str = "stop", completion_tokens: int = 1) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", **message}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": completion_tokens,
                      "total_tokens": 1 + completion_tokens}}


def send_json(handler, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def post_json(port: int, body: bytes, key: str | None, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
