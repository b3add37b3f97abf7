"""An OpenAI-compatible chat API over a local model, so any OpenAI client (and strop's own evaluations) can
use a base or tuned model by URL.

    server = make_server("strop/tiny-random", port=0)            # port 0: any free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="unused").chat.completions.create(...)

Endpoints: GET /v1/models, POST /v1/chat/completions (messages, max_tokens, temperature, top_p, n, stop, seed,
response_format: json_object or json_schema, enforced by grammar-constrained decoding; tools, answered with
`tool_calls` when the model writes Hermes-style <tool_call> blocks).
It binds to 127.0.0.1 unless told otherwise, checks `Authorization: Bearer KEY` when given a key, refuses
request bodies over `max_body` bytes (413) and `max_tokens` over `max_tokens_limit` (400). Requests are served
one generation at a time (one model, one CPU).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20
# One request's completion budget: far above any chat answer, far below what would hold the one generation
# slot (and everyone queued behind it) for an hour on a CPU.
MAX_TOKENS_LIMIT = 4096


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server on this machine ('localhost', 127.x.x.x, ::1)."""
    import ipaddress
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, api_key: str | None, key_flag: str = "--api-key-env VAR") -> str | None:
    """The warning a server bound beyond this machine without a key deserves, or None."""
    if api_key or is_loopback(host):
        return None
    return (f"warning: listening on {host}, reachable from other machines, with no API key: anyone who can reach "
            f"this port can use it. Pass {key_flag}, or bind --host 127.0.0.1.")


def schema_of(response_format) -> dict | None:
    """The JSON schema a request's `response_format` holds the output to (None for free text)."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):
            return schema
        raise ValueError("'response_format' json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
    raise ValueError("'response_format' must be {'type': 'text' | 'json_object' | 'json_schema', ...}")


TOOL_STOP = "</tool_call>"


def tools_of(tools) -> list[dict] | None:
    """The request's `tools`, checked: OpenAI function tools."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in tools):
        raise ValueError("'tools' must be a list of {'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
    return tools or None


def tool_reply(text: str, finish: str) -> tuple[dict, str]:
    """A reply with <tool_call> blocks as OpenAI `tool_calls` (finish_reason tool_calls); other text stays content."""
    from strop.renderers.tools import parse_tool_calls
    calls, _ = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    content = text[:text.index("<tool_call>")].strip() or None
    return ({"role": "assistant", "content": content,
             "tool_calls": [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]},
            "tool_calls")


class ModelServer(ThreadingHTTPServer):
    """One thread per connection. The threads are daemons, so an idle keep-alive client never holds the process
    open, but `server_close` closes their connections and joins them: a handler thread still freeing tensors
    while the interpreter shuts down aborts the whole process (torch re-takes the GIL in a C++ destructor)."""

    daemon_threads = True
    close_wait = 60.0  # seconds server_close waits for a generation in flight before it leaves the thread be

    def __init__(self, address, sampler, renderer, model_name: str, api_key: str | None, max_body: int,
                 max_tokens_limit: int = MAX_TOKENS_LIMIT):
        super().__init__(address, _Handler)
        self.sampler, self.renderer, self.model_name = sampler, renderer, model_name
        self.api_key, self.max_body, self.max_tokens_limit = api_key, max_body, max_tokens_limit
        self.lock = threading.Lock()
        self._live: dict[threading.Thread, socket.socket] = {}
        self._live_lock = threading.Lock()

    def process_request(self, request, client_address):
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address), daemon=True)
        with self._live_lock:
            self._live[thread] = request
        thread.start()

    def _serve_connection(self, request, client_address):
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._live_lock:
                self._live.pop(threading.current_thread(), None)

    def server_close(self):
        super().server_close()
        with self._live_lock:
            live = list(self._live.items())
        for _, request in live:
            try:
                request.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting for the next keep-alive request
            except OSError:
                pass
        for thread, _ in live:
            thread.join(self.close_wait)

    def complete(self, body: dict) -> dict:
        from strop import types
        from strop.renderers import get_text_content
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("'messages' must be a non-empty list of {role, content} objects")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 256
        n = body.get("n") or 1
        if not isinstance(max_tokens, int) or max_tokens < 1 or not isinstance(n, int) or not 1 <= n <= 16:
            raise ValueError("'max_tokens' must be a positive integer and 'n' between 1 and 16")
        if max_tokens > self.max_tokens_limit:
            raise ValueError(f"'max_tokens' {max_tokens} is over this server's limit of {self.max_tokens_limit}; ask "
                             f"for fewer, or restart the server with a higher --max-tokens-limit")
        stop = body.get("stop")
        extra = [stop] if isinstance(stop, str) else list(stop or [])  # the client's stops cut the text below
        tools = tools_of(body.get("tools"))
        stops = self.renderer.get_stop_sequences() + ([TOOL_STOP] if tools else [])
        params = types.SamplingParams(max_tokens=max_tokens, temperature=float(body.get("temperature", 1.0)),
                                      top_p=float(body.get("top_p", 1.0)), seed=body.get("seed"), stop=stops,
                                      json_schema=schema_of(body.get("response_format")))
        if tools:
            from strop.renderers.tools import hermes_turn
            prompt = self.renderer.build_tool_prompt([hermes_turn(m) for m in messages], tools)
        else:
            prompt = self.renderer.build_generation_prompt(messages)
        with self.lock:
            result = self.sampler.sample(prompt=prompt, num_samples=n, sampling_params=params).result()
        choices, completion_tokens = [], 0
        for i, seq in enumerate(result.sequences):
            message, ok = self.renderer.parse_response(seq.tokens)
            text = get_text_content(message)
            finish = "stop" if ok else "length"
            for s in extra:
                if s in text:
                    text, finish = text[:text.index(s)], "stop"
            reply = {"role": "assistant", "content": text}
            if tools:
                reply, finish = tool_reply(text, finish)
            choices.append({"index": i, "message": reply, "finish_reason": finish})
            completion_tokens += len(seq.tokens)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt.length, "completion_tokens": completion_tokens,
                          "total_tokens": prompt.length + completion_tokens}}


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: one line per request is noise under an evaluation
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send(status, {"error": {"message": message, "type": kind}})

    def _authorised(self) -> bool:
        if self.server.api_key and self.headers.get("Authorization") != f"Bearer {self.server.api_key}":
            self._error(401, "missing or wrong API key (send Authorization: Bearer KEY)", "authentication_error")
            return False
        return True

    def do_GET(self):
        if not self._authorised():
            return
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model",
                                                          "owned_by": "strop"}]})
        elif self.path == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._error(404, f"no route {self.path}; try /v1/chat/completions or /v1/models")

    def do_POST(self):
        if not self._authorised():
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path}; try /v1/chat/completions")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.server.max_body:
            self.close_connection = True  # the unread body must not be taken for the next request
            self._error(413, f"request body of {length} bytes is over the limit of {self.server.max_body}")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            self._send(200, self.server.complete(body))
        except (ValueError, TypeError) as exc:
            self._error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - the client gets a 500 with the reason, the server keeps going
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")


def make_server(model: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                adapter: str | None = None, base_path: str | None = None, name: str | None = None,
                max_body: int = MAX_BODY, max_tokens_limit: int = MAX_TOKENS_LIMIT) -> ModelServer:
    """A server for `model` (a base model id or folder), optionally with a LoRA adapter directory on top."""
    import strop
    from strop import model_info
    from strop.renderers import get_renderer
    from strop.tokenizer_utils import get_tokenizer
    base = base_path or model
    sampler = strop.ServiceClient().create_sampling_client(base_model=base, model_path=adapter)
    renderer = get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(base))
    return ModelServer((host, port), sampler, renderer, name or model, api_key, max_body, max_tokens_limit)
