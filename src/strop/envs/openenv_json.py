"""JSON in and out of the OpenEnv server: the error a message it cannot act on raises (an error frame, never a
crash), a client's JSON read with INVALID_JSON for anything unreadable, and replies written as strict JSON."""

from __future__ import annotations

import json
import math
from typing import Any


class ProtocolError(Exception):
    """A message the server cannot act on: an error frame (or JSON-RPC error) naming what to fix, never a crash."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message

    def frame(self) -> dict:
        return {"type": "error", "data": {"message": self.message, "code": self.code}}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: Any, limit: int = 100) -> str:
    """A client's value as an error message repeats it: its repr, cut to `limit` characters (a 1 MB name must not
    come back as a 1 MB error)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def wire_safe(value: Any) -> Any:
    """A reply made safe to send as strict JSON: a float that is not finite (an answer parsed as 1e308 billion)
    becomes null, and a string with lone surrogates (echoed from a client) gets U+FFFD in their place. JSON has no
    Infinity or NaN (JavaScript, Go and Rust parsers refuse them), and a lone surrogate cannot be encoded as UTF-8."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, dict):
        return {wire_safe(k) if isinstance(k, str) else k: wire_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [wire_safe(v) for v in value]
    return value


def dumps(reply: Any) -> str:
    """A reply as strict JSON text (see `wire_safe`)."""
    return json.dumps(wire_safe(reply), default=str, allow_nan=False)


def parse_json(raw: str | bytes, example: str) -> Any:
    """A client's JSON text; INVALID_JSON (not a crash) for text that is not JSON, nests deeper than Python's
    stack, or holds an integer too long to read."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        why = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ProtocolError("INVALID_JSON", f"the {example} is not JSON ({why})") from None
