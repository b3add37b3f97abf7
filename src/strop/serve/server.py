"""An OpenAI-compatible chat API over a local model, so any OpenAI client (and strop's own evaluations) can
use a base or tuned model by URL.

    server = make_server("strop/tiny-random", port=0)            # port 0: any free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="unused").chat.completions.create(...)

Endpoints: GET /v1/models, POST /v1/chat/completions (messages, max_tokens, temperature, top_p, n, stop, seed,
response_format: json_object or json_schema, enforced by grammar-constrained decoding; tools, answered with
`tool_calls` when the model writes Hermes-style <tool_call> blocks). It binds to 127.0.0.1 unless told otherwise
and checks `Authorization: Bearer KEY` when given a key. Requests are served one generation at a time (one model,
one CPU), so what any one client can hold is bounded:

- a body needs a valid Content-Length (411 without one, 400 for a bad one) of at most `max_body` bytes (413,
  refused before any of it is read);
- every field is checked before anything runs (`strop.serve.requests`: 400 naming the field), `max_tokens` up
  to `max_tokens_limit`, and a prompt over `max_prompt_tokens` tokens (the model's context unless told) is
  refused before it reaches the model;
- a request must arrive whole within `read_timeout` seconds of its first byte, and a keep-alive connection
  waits `idle_timeout` seconds for its next one; past `max_connections` open connections a new one gets 503;
- generation runs in chunks and stops when its client has gone away, so the next request starts at once.
"""

from __future__ import annotations

import io
import ipaddress
import json
import re
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import strop
from strop import model_info
from strop.models import resolve_model
from strop.serve.requests import TOOL_STOP, RequestError, read_request, tool_reply
from strop.tokenizer_utils import get_tokenizer

MAX_BODY = 1 << 20
# One request's completion budget: far above any chat answer, far below what would hold the one generation
# slot (and everyone queued behind it) for an hour on a CPU.
MAX_TOKENS_LIMIT = 4096
READ_TIMEOUT_S = 30.0     # a request's head and body, from its first byte
IDLE_TIMEOUT_S = 30.0     # a keep-alive connection waiting for its next request
MAX_CONNECTIONS = 64      # a thread each; more are answered 503 at once
DEFAULT_MAX_PROMPT_TOKENS = 32_768   # for a model whose config.json names no context length
# Generation runs in chunks (64 tokens, then 256 at a time); between them, whether the client is still there is
# asked. Most answers end within the first; each later chunk re-reads the prompt and the tokens so far (the engine
# keeps no cache between calls), which for one row costs a few percent of the chunk's decoding.
FIRST_CHUNK, CHUNK = 64, 256


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server on this machine ('localhost', 127.x.x.x, ::1)."""
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


def context_length(model_dir: str | Path) -> int | None:
    """A model's context window in tokens, from its config.json (None when it does not say)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return config[key]
    return None


def generate(sampler, prompt, n: int, params, decode: Callable[[list[int]], str],
             gone: Callable[[], bool]) -> list | None:
    """`n` samples of `prompt` (SampledSequences), or None as soon as `gone()` says the client has left.

    The engine cannot stop a generation midway, so it is asked for chunks (FIRST_CHUNK tokens, then CHUNK at a
    time), each continuing from the prompt and the tokens so far, with `gone()` asked between them. The first is the
    request as it came (same seed, same tokens); a continued row is its own request, seeded from the request's
    seed, the row and the chunk; a stop string that spans two chunks, which the engine sees one at a time, is
    found here. A JSON-schema request runs whole: its grammar's state cannot be carried across chunks."""
    # lazy: strop.types pulls in torch, numpy, which importing this module does not need
    from strop import types
    if gone():
        return None
    if params.json_schema is not None:
        return list(sampler.sample(prompt=prompt, num_samples=n, sampling_params=params).result().sequences)
    total = params.max_tokens
    strings = [s for s in params.stop or () if isinstance(s, str)]
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    size, chunk = FIRST_CHUNK, 0
    while live := [i for i in range(n) if reasons[i] is None]:
        if chunk and gone():
            return None
        if chunk == 0:
            first = replace(params, max_tokens=min(size, total))
            batches = [(live, sampler.sample(prompt=prompt, num_samples=n, sampling_params=first))]
        else:       # every row submitted before any is read: the engine runs them as one batch
            batches = [([i], sampler.sample(
                prompt=prompt.append(types.EncodedTextChunk(tokens=tokens[i])), num_samples=1,
                sampling_params=replace(params, max_tokens=min(size, total - len(tokens[i])),
                                        seed=_chunk_seed(params.seed, i, chunk)))) for i in live]
        for rows, future in batches:
            for i, seq in zip(rows, future.result().sequences):
                since = len(tokens[i])
                tokens[i] += seq.tokens
                logprobs[i] += seq.logprobs
                cut = _spanning_stop(tokens[i], since, strings, decode) if strings and since else None
                if cut is not None:
                    del tokens[i][cut:], logprobs[i][cut:]
                    reasons[i] = "stop"
                elif seq.stop_reason == "stop" or len(tokens[i]) >= total:
                    reasons[i] = seq.stop_reason
        size, chunk = CHUNK, chunk + 1
    return [types.SampledSequence(stop_reason=r, tokens=t, logprobs=lp) for r, t, lp in zip(reasons, tokens, logprobs)]


def _chunk_seed(seed: int | None, row: int, chunk: int) -> int | None:
    return None if seed is None else (seed * 1_000_003 + (row + 1) * 7_919 + chunk * 104_729) % (2**63 - 1)


def _spanning_stop(tokens: list[int], since: int, stops: list[str], decode) -> int | None:
    """The length at which `tokens` first hold a stop string begun before `since` (in an earlier chunk), or None."""
    start = max(0, since - max(len(s) for s in stops) - 2)   # a token is at least one character
    if not any(s in decode(tokens[start:]) for s in stops):
        return None
    return next((end for end in range(since + 1, len(tokens) + 1)
                 if any(s in decode(tokens[start:end]) for s in stops)), None)


class ModelServer(ThreadingHTTPServer):
    """One thread per connection (at most `max_connections`). The threads are daemons, so an idle keep-alive
    client never holds the process open, but `server_close` closes their connections and joins them: a handler
    thread still freeing tensors while the interpreter shuts down aborts the whole process (torch re-takes the GIL
    in a C++ destructor)."""

    daemon_threads = True
    close_wait = 60.0  # seconds server_close waits for a generation in flight before it leaves the thread be

    def __init__(self, address, sampler, renderer, model_name: str, api_key: str | None, max_body: int,
                 max_tokens_limit: int = MAX_TOKENS_LIMIT, max_prompt_tokens: int | None = None,
                 prompt_limit_source: str = "--max-prompt-tokens", read_timeout: float = READ_TIMEOUT_S,
                 idle_timeout: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
        for name, value in (("read_timeout", read_timeout), ("idle_timeout", idle_timeout)):
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        super().__init__(address, _Handler)
        self.sampler, self.renderer, self.model_name = sampler, renderer, model_name
        self.api_key, self.max_body, self.max_tokens_limit = api_key, max_body, max_tokens_limit
        self.max_prompt_tokens, self.prompt_limit_source = max_prompt_tokens, prompt_limit_source
        self.read_timeout, self.idle_timeout, self.max_connections = read_timeout, idle_timeout, max_connections
        self.lock = threading.Lock()
        self._live: dict[threading.Thread, socket.socket] = {}
        self._live_lock = threading.Lock()

    def process_request(self, request, client_address):
        with self._live_lock:
            full = len(self._live) >= self.max_connections
            if not full:
                thread = threading.Thread(target=self._serve_connection, args=(request, client_address),
                                          daemon=True)
                self._live[thread] = request
        if full:                    # answered here, without a thread: the accept loop is never held by it
            _refuse_busy(request, self.max_connections)
            self.shutdown_request(request)
            return
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
                request.shutdown(socket.SHUT_RDWR)  # wakes a waiting thread; a generation sees its client gone
            except OSError:
                pass
        for thread, _ in live:
            thread.join(self.close_wait)

    def complete(self, body: Any, gone: Callable[[], bool] = lambda: False) -> dict | None:
        """The chat completion for a parsed request body (RequestError for a bad one), or None when `gone()`
        said the client left before it was done."""
        # lazy: strop.types pulls in torch, numpy, which importing this module does not need
        from strop import types
        from strop.renderers import get_text_content
        request = read_request(body, self.max_tokens_limit)
        # lazy: strop.renderers.tools pulls in torch, numpy, which importing this module does not need
        from strop.renderers.tools import hermes_turn
        # text content (null or text parts read), earlier tool calls written out, a developer turn as a system one
        shown = [{**turn, "role": "system"} if turn["role"] == "developer" else turn
                 for turn in (hermes_turn(m) for m in request.messages)]
        if request.tools:
            prompt = self.renderer.build_tool_prompt(shown, request.tools)
        else:
            prompt = self.renderer.build_generation_prompt(shown)
        if self.max_prompt_tokens is not None and prompt.length > self.max_prompt_tokens:
            raise RequestError(f"the prompt is {prompt.length} tokens, over this server's limit of "
                               f"{self.max_prompt_tokens} ({self.prompt_limit_source}); send a shorter "
                               "conversation", "messages")
        # the client's stops end generation too (they were only cut from the text, after max_tokens of it)
        stops = self.renderer.get_stop_sequences() + ([TOOL_STOP] if request.tools else []) + list(request.stop)
        room = request.max_tokens if self.max_prompt_tokens is None else self.max_prompt_tokens - prompt.length
        if room < 1:
            raise RequestError(f"the prompt is {prompt.length} tokens and fills the model's context; send a shorter "
                               "conversation", "messages")
        params = types.SamplingParams(max_tokens=min(request.max_tokens, room), temperature=request.temperature,
                                      top_p=request.top_p, seed=request.seed, stop=stops, json_schema=request.schema)
        with self.lock:
            sequences = generate(self.sampler, prompt, request.n, params, self.renderer.tokenizer.decode, gone)
        if sequences is None:
            return None
        choices, completion_tokens = [], 0
        for i, seq in enumerate(sequences):
            message, ok = self.renderer.parse_response(seq.tokens)
            text = get_text_content(message)
            finish = "stop" if ok else "length"
            for s in request.stop:                  # the client's own stops cut the text
                if s in text:
                    text, finish = text[:text.index(s)], "stop"
            reply = {"role": "assistant", "content": text}
            if request.tools:
                reply, finish = tool_reply(text, finish)
            choices.append({"index": i, "message": reply, "finish_reason": finish})
            completion_tokens += len(seq.tokens)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt.length, "completion_tokens": completion_tokens,
                          "total_tokens": prompt.length + completion_tokens}}


def _refuse_busy(request: socket.socket, limit: int) -> None:
    data = json.dumps({"error": {"message": f"the server has {limit} connections open, its limit; retry shortly",
                                 "type": "server_error", "param": None, "code": None}}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Retry-After: 1\r\nConnection: close\r\n\r\n").encode()
    try:
        request.setblocking(False)
        request.send(head + data)
    except OSError:
        pass


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each waiting only for what is left before `deadline`: a timeout per read alone lets a
    client that sends a byte every few seconds hold its thread for good."""

    def __init__(self, sock: socket.socket):
        self.sock, self.deadline = sock, None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: ModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: one line per request is noise under an evaluation
        pass

    def setup(self):
        super().setup()
        plain, self._reader = self.rfile, _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        plain.close()

    def handle_one_request(self):
        # the next request's first byte within the idle timeout, then all of it within the read timeout
        self._reader.deadline = time.monotonic() + self.server.idle_timeout
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except OSError:                 # TimeoutError included: idle too long, or the client reset
            self.close_connection = True
            return
        self._reader.deadline = time.monotonic() + self.server.read_timeout
        super().handle_one_request()

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.connection.settimeout(self.server.read_timeout)   # a client that never reads its answer is dropped
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
               close: bool = False) -> None:
        """OpenAI's error body. `close` when the request's body was not read: its bytes must not be taken for the
        next request."""
        self.close_connection = self.close_connection or close
        self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})

    def send_error(self, code, message=None, explain=None):  # the standard library's refusals, in the same shape
        self._error(int(code), (message or HTTPStatus(code).phrase)[:200], close=True)

    def _authorised(self) -> bool:
        if self.server.api_key and self.headers.get("Authorization") != f"Bearer {self.server.api_key}":
            self._error(401, "missing or wrong API key (send Authorization: Bearer KEY)", "authentication_error",
                        close=True)
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
            self._error(404, f"no route {self.path[:200]}; try /v1/chat/completions or /v1/models")

    def do_POST(self):
        if not self._authorised():
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path[:200]}; try /v1/chat/completions", close=True)
            return
        data = self._body()
        if data is None:
            return
        try:
            try:
                body = json.loads(data)
            except (ValueError, RecursionError) as exc:      # RecursionError: nested deeper than Python's stack
                why = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
                raise RequestError(f"the request body is not JSON ({why})") from None
            reply = self.server.complete(body, gone=self._client_gone)
            if reply is None:                                 # the client left: nobody to answer
                self.close_connection = True
                return
            self._send(200, reply)
        except RequestError as exc:
            self._error(exc.status, exc.message, param=exc.param)
        except (ValueError, TypeError) as exc:
            self._error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - the client gets a 500 with the reason, the server keeps going
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

    def _body(self) -> bytes | None:
        """The request body, or None when it was refused (and answered) or never came. A refused body is never
        read, and its connection is closed."""
        if self.headers.get("Transfer-Encoding"):
            self._error(411, "send the body with a Content-Length header; chunked transfer encoding is not "
                             "supported", close=True)
            return None
        declared = set(self.headers.get_all("Content-Length") or [])
        if not declared:
            self._error(411, "a POST needs a Content-Length header", close=True)
            return None
        value = declared.pop().strip()
        if declared or not re.fullmatch(r"[0-9]{1,19}", value):
            self._error(400, f"Content-Length {value[:30]!r} is not a byte count (one non-negative integer)",
                        close=True)
            return None
        length = int(value)
        if length > self.server.max_body:
            self._error(413, f"request body of {length} bytes is over the limit of {self.server.max_body} "
                             "(--max-body-bytes)", close=True)
            return None
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            self._error(408, f"the request did not arrive whole within {self.server.read_timeout:g} s of its first "
                             "byte; send it at once", close=True)
            return None
        if len(data) < length:                          # the client closed mid-body
            self.close_connection = True
            return None
        return data

    def _client_gone(self) -> bool:
        """Whether the client has closed its connection (asked between chunks of generation)."""
        try:
            poller = select.poll()
            poller.register(self.connection, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(0):
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


def make_server(model: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                adapter: str | None = None, base_path: str | None = None, name: str | None = None,
                max_body: int = MAX_BODY, max_tokens_limit: int = MAX_TOKENS_LIMIT,
                max_prompt_tokens: int | None = None, read_timeout: float = READ_TIMEOUT_S,
                idle_timeout: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> ModelServer:
    """A server for `model` (a base model id or folder), optionally with a LoRA adapter directory on top. Prompts
    over `max_prompt_tokens` are refused; by default, over the model's context."""
    # lazy: strop.renderers pulls in torch, numpy, which importing this module does not need
    from strop.renderers import get_renderer
    base = base_path or model
    sampler = strop.ServiceClient().create_sampling_client(base_model=base, model_path=adapter)
    renderer = get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(base))
    source = "--max-prompt-tokens"
    if max_prompt_tokens is None:       # the sampler has just loaded the model, so its folder is here
        context = context_length(resolve_model(base, download=False))
        max_prompt_tokens = context or DEFAULT_MAX_PROMPT_TOKENS
        source = (f"the model's context of {context} tokens" if context else
                  f"a default of {DEFAULT_MAX_PROMPT_TOKENS}: the model's config.json names no context length")
    return ModelServer((host, port), sampler, renderer, name or model, api_key, max_body, max_tokens_limit,
                       max_prompt_tokens=max_prompt_tokens, prompt_limit_source=source, read_timeout=read_timeout,
                       idle_timeout=idle_timeout, max_connections=max_connections)
