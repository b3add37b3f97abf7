"""A chat completion request as `strop serve` takes it: every field checked before anything runs, and each bad
one refused with a 400 that names it (OpenAI's error body: message, type, param).

    request = read_request({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}, max_tokens_limit=4096)
    request.max_tokens, request.temperature          # 256, 0.0

Numbers must be finite and in OpenAI's ranges (temperature 0..2, top_p in (0, 1], n 1..16, max_tokens 1..the
server's limit); `null` or a missing field takes the default; a field of the wrong type is refused, not coerced
(a temperature of "0.7", NaN or 1e999 is an error, and a max_tokens of 0 is not quietly 256). `logprobs` and
`top_logprobs` (0..20, with logprobs true) are served (`strop.serve.logprobs`).
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from strop.serve.logprobs import MAX_TOP_LOGPROBS

DEFAULT_MAX_TOKENS = 256
ROLES = ("system", "developer", "user", "assistant", "tool")   # OpenAI's; a developer turn is read as a system turn
MAX_N = 16
MAX_STOPS, MAX_STOP_CHARS = 4, 1000   # OpenAI takes up to 4 stop sequences
# A response_format schema is compiled to a grammar while every other request waits: 4,000 optional properties
# took 37 s to compile (growing as their cube), 128 take milliseconds.
MAX_SCHEMA_CHARS, MAX_PROPERTIES = 16_384, 128
TOOL_STOP = "</tool_call>"


class RequestError(ValueError):
    """A request the server refuses: the message for the client, the field at fault and the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    max_tokens: int
    n: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]            # the client's own stop strings, cut from the text after generation
    schema: dict | None              # response_format's JSON schema (None for free text)
    tools: list[dict] | None
    logprobs: bool = False           # each reply token's logprob (OpenAI's choices[i].logprobs.content)
    top_logprobs: int = 0            # with it, the k likeliest tokens at each place (0..MAX_TOP_LOGPROBS)


def read_request(body: Any, max_tokens_limit: int) -> ChatRequest:
    """The checked request in a parsed JSON body; RequestError naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object such as {{\"messages\": [{{\"role\": \"user\", "
                           f"\"content\": \"Hi\"}}]}}, not {_shown(body)}")
    if body.get("stream"):
        raise RequestError("streaming is not supported by strop serve; send \"stream\": false or leave it out",
                           "stream")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, name, min(DEFAULT_MAX_TOKENS, max_tokens_limit), 1)
    if max_tokens > max_tokens_limit:
        raise RequestError(f"'{name}' {max_tokens} is over this server's limit of {max_tokens_limit}; ask for "
                           "fewer, or restart the server with a higher --max-tokens-limit", name)
    n = _integer(body, "n", 1, 1)
    if n > MAX_N:
        raise RequestError(f"'n' must be between 1 and {MAX_N}, got {n}", "n")
    seed = _integer(body, "seed", None, -(2 ** 63))
    if seed is not None and seed >= 2 ** 63:
        raise RequestError(f"'seed' must fit in 64 bits, got {seed}", "seed")
    logprobs, top_logprobs = _logprobs(body)
    return ChatRequest(messages=_messages(body.get("messages")), max_tokens=max_tokens, n=n,
                       temperature=_number(body, "temperature", 1.0, 0.0, 2.0, "between 0 and 2"),
                       top_p=_number(body, "top_p", 1.0, 0.0, 1.0, "greater than 0 and at most 1", open_low=True),
                       seed=seed, stop=_stops(body.get("stop")), schema=schema_of(body.get("response_format")),
                       tools=tools_of(body.get("tools")), logprobs=logprobs, top_logprobs=top_logprobs)


def _logprobs(body: dict) -> tuple[bool, int]:
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestError(f"'logprobs' must be true or false, got {_shown(logprobs)}", "logprobs")
    top = _integer(body, "top_logprobs", 0, 0)
    if top > MAX_TOP_LOGPROBS:
        raise RequestError(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}, got {top}", "top_logprobs")
    if top and not logprobs:
        raise RequestError("'top_logprobs' needs \"logprobs\": true", "top_logprobs")
    return bool(logprobs), top


def _messages(messages: Any) -> list[dict]:
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    # lazy: strop.renderers pulls in torch, numpy, which importing this module does not need
    from strop.renderers.tools import content_problem, tool_call_problem
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise RequestError(f"'messages[{i}].role' must be one of {', '.join(ROLES)}, not {_shown(m['role'])}",
                               f"messages[{i}].role")
        if (problem := content_problem(m.get("content"))) is not None:
            raise RequestError(f"'messages[{i}]': {problem}", f"messages[{i}].content")
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list) or m["role"] != "assistant":
            raise RequestError(f"'messages[{i}].tool_calls' must be a list, on an assistant message",
                               f"messages[{i}].tool_calls")
        for j, call in enumerate(calls):
            if (problem := tool_call_problem(call)) is not None:
                raise RequestError(f"'messages[{i}].tool_calls[{j}]': {problem}", f"messages[{i}].tool_calls")
    return messages


def _integer(body: dict, name: str, default: int | None, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{name}' must be an integer, got {_shown(value)}", name)
    if value < low:
        raise RequestError(f"'{name}' must be at least {low}, got {value}", name)
    return value


def _number(body: dict, name: str, default: float, low: float, high: float, range_text: str,
            open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number {range_text}, got {_shown(value)}", name)
    if not math.isfinite(value) or value > high or value < low or (open_low and value == low):
        raise RequestError(f"'{name}' must be a finite number {range_text}, got {value!r}", name)
    return float(value)


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):
        raise RequestError(f"'stop' must be a string or a list of at most {MAX_STOPS} non-empty strings of at most "
                           f"{MAX_STOP_CHARS} characters", "stop")
    return tuple(stops)


def _shown(value: Any) -> str:
    """A client's value as an error repeats it: short, whatever it was."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    if isinstance(value, str) and len(value) > 60:
        return "a long JSON string"
    text = repr(value) if isinstance(value, float) else json.dumps(value)
    return text if len(text) <= 60 else text[:60] + "..."


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
        inner = response_format.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if isinstance(schema, dict):
            return _bounded(schema)
        raise RequestError("'response_format' json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                           "response_format")
    raise RequestError("'response_format' must be {'type': 'text' | 'json_object' | 'json_schema', ...}",
                       "response_format")


def _bounded(schema: dict) -> dict:
    """`schema`, if it is small enough to compile quickly (see MAX_SCHEMA_CHARS)."""
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_CHARS:
        raise RequestError(f"'response_format' schema is {size} characters of JSON; the limit is {MAX_SCHEMA_CHARS}",
                           "response_format")
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict) and len(properties) > MAX_PROPERTIES:
                raise RequestError(f"'response_format' schema has an object of {len(properties)} properties; the "
                                   f"limit is {MAX_PROPERTIES}", "response_format")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def tools_of(tools) -> list[dict] | None:
    """The request's `tools`, checked: OpenAI function tools."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in tools):
        raise RequestError("'tools' must be a list of {'type': 'function', 'function': {'name': ..., "
                           "'parameters': ...}}", "tools")
    return tools or None


def tool_reply(text: str, finish: str) -> tuple[dict, str]:
    """A reply with <tool_call> blocks as OpenAI `tool_calls` (finish_reason tool_calls); other text stays content."""
    # lazy: strop.renderers.tools pulls in torch, numpy, which importing this module does not need
    from strop.renderers.tools import parse_tool_calls
    calls, _ = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    content = text[:text.index("<tool_call>")].strip() or None
    return ({"role": "assistant", "content": content,
             "tool_calls": [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]},
            "tool_calls")
