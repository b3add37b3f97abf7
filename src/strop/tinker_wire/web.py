"""The HTTP plumbing `strop serve-tinker`'s routes share: the state they close over (`WireState`, whose `route`
makes a handler a Starlette route that answers a WireError as `{"detail": message}`), request bodies read within
their size and time bounds (zstd or plain), JSON bodies read with the SDK's request models, and the replies and
pages more than one route gives."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import pydantic
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from strop.tinker_wire.codec import WireError
from strop.tinker_wire.limits import BODY_TIMEOUT_S, MAX_JSON_BYTES
from strop.tinker_wire.service import TinkerService
from strop.tinker_wire.tenants import Tenancy


@dataclass
class WireState:
    """What every route handler reaches: the service, who a request's API key is, the app's settings, and the
    routes made so far, in the order Starlette tries them."""
    service: TinkerService
    tenancy: Tenancy
    sample_concurrency: int
    long_poll_s: float
    routes: list = field(default_factory=list)

    def route(self, path: str, methods=("POST",)):
        """Decorates a handler `(request, who)` (`who`: the owner of the request's API key) into a route of the
        app; a WireError it raises is its reply."""
        def wrap(handler):
            async def endpoint(request: Request):
                try:
                    return await handler(request, self.tenancy.owner(request.headers))
                except WireError as exc:
                    return fail(exc)
            self.routes.append(Route(path, endpoint, methods=list(methods)))
            return handler
        return wrap


def fail(exc: WireError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=exc.status)


def future_reply(future_id: str, **extra) -> JSONResponse:
    return JSONResponse({"request_id": future_id, **extra})


async def body_bytes(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise WireError(f"request body over {limit} bytes; send smaller requests", 413)
    body = bytearray()

    async def read():
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise WireError(f"request body over {limit} bytes; send smaller requests", 413)
    try:
        await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise WireError(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s", 408) from None
    encoding = request.headers.get("content-encoding", "").lower()
    if encoding == "zstd":
        body = bytearray(_unzstd(bytes(body), limit))
    elif encoding not in ("", "identity"):
        raise WireError(f"content-encoding {encoding[:20]!r} is not supported (zstd or none)", 415)
    return bytes(body)


async def read_field(request: Request, name: str, example: str):
    """One field of a small JSON object body (None when absent)."""
    raw = await body_bytes(request, MAX_JSON_BYTES)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):     # RecursionError: nesting deeper than the parser goes
        data = None
    if not isinstance(data, dict):
        raise WireError(f"the body must be a JSON object such as {example}")
    return data.get(name)


async def read_model(request: Request, model_cls):
    raw = await body_bytes(request, MAX_JSON_BYTES)
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise WireError("the body is not JSON") from None
    except RecursionError:      # was a 500 with a traceback, which the SDK retries
        raise WireError("the JSON body is nested too deeply; send the request the SDK's models describe") \
            from None
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                             for e in exc.errors()[:5])
        raise WireError(f"{model_cls.__name__}: {problems}") from None


async def finished(service: TinkerService, record, timeout: float | None = None) -> bool:
    """Wait, off the worker, until the future `record` is done (at most `timeout` seconds); False when it is not
    done by then. A done record is marked read."""
    if not record.done:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        service.add_waiter(record, loop, waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            return False
    record.read_at = time.time()
    return True


def page(request: Request, items: list) -> tuple[list, dict]:
    try:
        limit = min(max(int(request.query_params.get("limit", 20)), 1), 1000)
        offset = max(int(request.query_params.get("offset", 0)), 0)
    except ValueError:
        raise WireError("limit and offset must be integers") from None
    return items[offset:offset + limit], {"offset": offset, "limit": limit, "total_count": len(items)}


def _unzstd(body: bytes, limit: int) -> bytes:
    import zstandard  # lazy: only a compressed body needs it (the tinker SDK depends on it)
    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise WireError(f"the zstd body does not decompress ({exc})") from None
    if len(out) > limit:
        raise WireError(f"the decompressed body is over {limit} bytes", 413)
    return out
