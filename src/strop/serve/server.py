"""An OpenAI-compatible chat API over a local model, so any OpenAI client (and strop's own evaluations) can
use a base or tuned model by URL.

    server = make_server("strop/tiny-random", port=0)            # port 0: any free port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="unused").chat.completions.create(...)

Endpoints: GET /v1/models, POST /v1/chat/completions (messages, max_tokens, temperature, top_p, n, stop, seed,
response_format: json_object or json_schema, enforced by grammar-constrained decoding; tools, answered with
`tool_calls` when the model writes Hermes-style <tool_call> blocks; logprobs and top_logprobs). It binds to
127.0.0.1 unless told otherwise and checks `Authorization: Bearer KEY` when given a key; a web page cannot use it
through a visitor's browser (`strop.serve.guard`: Host, Origin and Content-Type checked). One chunk of generation
runs at a time (one model, one CPU), so what any one client can hold is bounded:

- a body needs a valid Content-Length (411 without one, 400 for a bad one) of at most `max_body` bytes (413,
  refused before any of it is read);
- every field is checked before anything runs (`strop.serve.requests`: 400 naming the field), `max_tokens` up
  to `max_tokens_limit`, and a prompt over `max_prompt_tokens` tokens (the model's context unless told) is
  refused before it reaches the model;
- a request must arrive whole within `read_timeout` seconds of its first byte, and a keep-alive connection
  waits `idle_timeout` seconds for its next one; past `max_connections` open connections a new one gets 503;
- generation runs in chunks (`strop.serve.generation`), a json_schema request's too, and stops when its client has
  gone away; the chunks of different connections take turns (`strop.serve.turns`), so a newcomer waits for at most
  one chunk of another client's work, however many generations that client has asked for.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import re
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import strop
from strop import model_info
from strop.models import resolve_model
from strop.serve.generation import generate
from strop.serve.guard import content_type_problem, host_problem, is_loopback, origin_problem
from strop.serve.logprobs import describer, text_tokens, token_logprobs
from strop.serve.requests import TOOL_STOP, RequestError, read_request, tool_reply
from strop.serve.turns import Turns
from strop.tokenizer_utils import get_tokenizer

MAX_BODY = 1 << 20
# One request's completion budget: far above any chat answer, far below what would hold the one generation
# slot (and everyone queued behind it) for an hour on a CPU.
MAX_TOKENS_LIMIT = 4096
READ_TIMEOUT_S = 30.0     # a request's head and body, from its first byte
IDLE_TIMEOUT_S = 30.0     # a keep-alive connection waiting for its next request
MAX_CONNECTIONS = 64      # a thread each; more are answered 503 at once
DEFAULT_MAX_PROMPT_TOKENS = 32_768   # for a model whose config.json names no context length


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
                 idle_timeout: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 allowed_origins: tuple[str, ...] = ()):
        for name, value in (("read_timeout", read_timeout), ("idle_timeout", idle_timeout)):
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        super().__init__(address, _Handler)
        self.sampler, self.renderer, self.model_name = sampler, renderer, model_name
        self.api_key, self.max_body, self.max_tokens_limit = api_key, max_body, max_tokens_limit
        self.max_prompt_tokens, self.prompt_limit_source = max_prompt_tokens, prompt_limit_source
        self.read_timeout, self.idle_timeout, self.max_connections = read_timeout, idle_timeout, max_connections
        # web pages, besides this machine's, that may call it (--allow-origin); compared without a trailing slash
        self.allowed_origins = frozenset(o.strip().rstrip("/") for o in allowed_origins)
        self.turns = Turns()
        self._connections = itertools.count()       # a key per connection, for whose turn it is
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

    def complete(self, body: Any, gone: Callable[[], bool] = lambda: False, client: tuple = ("local", None)
                 ) -> dict | None:
        """The chat completion for a parsed request body (RequestError for a bad one), or None when `gone()`
        said the client left before it was done. `client` (address, connection) is whose turns it takes."""
        # lazy: strop.types pulls in torch, numpy, which importing this module does not need
        from strop import types
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

        def turn():
            return self.turns.turn(*client)
        sequences = generate(self.sampler, prompt, request.n, params, self.renderer.tokenizer.decode, gone, turn)
        if sequences is None:
            return None
        top = [None] * len(sequences)
        if request.top_logprobs:
            top = self._top_logprobs(prompt, sequences, request.top_logprobs, gone, turn)
            if top is None:
                return None
        choices = [self._choice(i, seq, request, top[i]) for i, seq in enumerate(sequences)]
        completion_tokens = sum(len(seq.tokens) for seq in sequences)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt.length, "completion_tokens": completion_tokens,
                          "total_tokens": prompt.length + completion_tokens}}

    def _choice(self, index: int, seq, request, top: list | None) -> dict:
        """One sample as OpenAI's choice: the reply (cut at the client's stops, tool calls read), why it ended, and
        its logprobs when asked for."""
        # lazy: strop.renderers pulls in torch, numpy, which importing this module does not need
        from strop.renderers import get_text_content
        message, ok = self.renderer.parse_response(seq.tokens)
        text = get_text_content(message)
        finish = "stop" if ok else "length"
        for s in request.stop:                  # the client's own stops cut the text
            if s in text:
                text, finish = text[:text.index(s)], "stop"
        logprobs = None
        if request.logprobs:
            shown = text_tokens(seq.tokens, text, self.renderer.tokenizer.decode)
            logprobs = {"content": token_logprobs(seq.tokens[:shown], seq.logprobs[:shown], top, self._describe),
                        "refusal": None}
        reply = {"role": "assistant", "content": text}
        if request.tools:
            reply, finish = tool_reply(text, finish)
        return {"index": index, "message": reply, "finish_reason": finish, "logprobs": logprobs}

    def _top_logprobs(self, prompt, sequences, k: int, gone, turn) -> list | None:
        """The `k` likeliest tokens at each place of each sample, from one teacher-forced pass over the prompt and
        the sample (one turn), or None when the client left."""
        # lazy: strop.types pulls in torch, numpy, which importing this module does not need
        from strop import types
        with turn():
            if gone():
                return None
            texts = [prompt.append(types.EncodedTextChunk(tokens=seq.tokens)) for seq in sequences]
            places = self.sampler.compute_topk_logprobs_many(texts, k).result()
        return [rows[prompt.length:] for rows in places]

    @functools.cached_property
    def _describe(self):
        return describer(self.renderer.tokenizer)


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
        self._turn_key = (self.client_address[0], next(self.server._connections))
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

    def _admitted(self) -> bool:
        """Whether the request may be answered at all: addressed to this machine, not from a foreign web page,
        with the key when one is set (`strop.serve.guard`); refused and answered otherwise."""
        host = self.headers.get("Host")
        problem = (host_problem(host, self.server.server_address[0])
                   or origin_problem(self.headers.get("Origin"), host, self.server.allowed_origins))
        if problem is not None:
            self._error(403, problem, "permission_error", close=True)
            return False
        return self._authorised()

    def _authorised(self) -> bool:
        if self.server.api_key and self.headers.get("Authorization") != f"Bearer {self.server.api_key}":
            self._error(401, "missing or wrong API key (send Authorization: Bearer KEY)", "authentication_error",
                        close=True)
            return False
        return True

    def do_GET(self):
        if not self._admitted():
            return
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model",
                                                          "owned_by": "strop"}]})
        elif self.path == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._error(404, f"no route {self.path[:200]}; try /v1/chat/completions or /v1/models")

    def do_POST(self):
        if not self._admitted():
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no route {self.path[:200]}; try /v1/chat/completions", close=True)
            return
        problem = content_type_problem(self.headers.get("Content-Type"))
        if problem is not None:
            self._error(415, problem, close=True)
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
            reply = self.server.complete(body, gone=self._client_gone, client=self._turn_key)
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
                idle_timeout: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                allowed_origins: tuple[str, ...] = ()) -> ModelServer:
    """A server for `model` (a base model id or folder), optionally with a LoRA adapter directory on top. Prompts
    over `max_prompt_tokens` are refused; by default, over the model's context. Web pages at `allowed_origins`
    (such as "http://my-ui.example:3000") may call it from a browser, besides those on this machine."""
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
                       idle_timeout=idle_timeout, max_connections=max_connections, allowed_origins=allowed_origins)
