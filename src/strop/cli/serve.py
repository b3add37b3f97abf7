"""`strop serve MODEL`: a base or tuned model as an OpenAI-compatible API on this machine."""

from __future__ import annotations

import argparse
import os
from urllib.parse import urlsplit

from strop.cli.output import note
from strop.errors import StropError
from strop.serve import make_server
from strop.serve.server import IDLE_TIMEOUT_S, MAX_BODY, MAX_TOKENS_LIMIT, READ_TIMEOUT_S, exposure_warning


def register(nouns) -> None:
    p = nouns.add_parser("serve", help="serve a base or tuned model as an OpenAI-compatible API",
                         description="Serve MODEL (a modelId from a run, or a selected base model) at "
                                     "/v1/chat/completions and /v1/models, for any OpenAI client and for "
                                     "`strop evaluations start --model openai:NAME@URL`.",
                         epilog="example:\n  strop serve model-2d69fb15 --port 8000 &\n"
                                "  strop evaluations start --model openai:model-2d69fb15@http://127.0.0.1:8000/v1 ...",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument("--api-key-env", metavar="VAR", help="require the key held in environment variable VAR")
    p.add_argument("--max-tokens-limit", type=int, default=MAX_TOKENS_LIMIT, metavar="N",
                   help="refuse requests asking for more than N completion tokens (default: %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY, metavar="N",
                   help="refuse request bodies over N bytes (default: %(default)s)")
    p.add_argument("--max-prompt-tokens", type=int, metavar="N",
                   help="refuse prompts over N tokens (default: the model's context, from its config.json)")
    p.add_argument("--read-timeout", type=float, default=READ_TIMEOUT_S, metavar="SECONDS",
                   help="drop a client whose request has not arrived whole this long after its first byte "
                        "(default: %(default)g)")
    p.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S, metavar="SECONDS",
                   help="close a kept-alive connection that sends no request for this long (default: %(default)g)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="let a web page at ORIGIN (such as http://my-ui.example:3000) call the server from a browser; "
                        "pages elsewhere than this machine are refused (repeat for several)")
    p.set_defaults(handler=run)


def run(args) -> int:
    # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control.evaluations import resolve_model
    for flag, value in (("--max-tokens-limit", args.max_tokens_limit), ("--max-body-bytes", args.max_body_bytes),
                        ("--max-prompt-tokens", args.max_prompt_tokens)):
        if value is not None and value < 1:
            raise StropError(f"{flag} must be at least 1, got {value}")
    for flag, value in (("--read-timeout", args.read_timeout), ("--idle-timeout", args.idle_timeout)):
        if not 0 < value < float("inf"):
            raise StropError(f"{flag} must be a positive number of seconds, got {value:g}")
    origins = tuple(_origin(o) for o in args.allow_origin)
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise StropError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    if args.model.startswith("model-"):
        _require_model(args.model)  # named here as the MODEL argument, not as the --model flag of evaluations
    model = resolve_model(args.model)
    if model.get("openai"):
        raise StropError(f"{args.model!r} is already an endpoint; serve a modelId or a selected base model")
    warning = exposure_warning(args.host, key)
    if warning:
        note(warning)
    server = make_server(model["baseModel"], base_path=model["basePath"], adapter=model["adapter"], host=args.host,
                         port=args.port, api_key=key, name=args.model, max_body=args.max_body_bytes,
                         max_tokens_limit=args.max_tokens_limit, max_prompt_tokens=args.max_prompt_tokens,
                         read_timeout=args.read_timeout, idle_timeout=args.idle_timeout,
                         allowed_origins=origins)
    note(f"serving {args.model} on http://{args.host}:{server.server_port}/v1 (Ctrl-C stops it)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _origin(value: str) -> str:
    """An --allow-origin value, checked: scheme://host[:port], as a browser sends it in Origin."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise StropError(f"--allow-origin {value!r}: give a web page's origin, scheme://host[:port], such as "
                         "http://localhost:3000 (no path)")
    return value.strip().rstrip("/")


def _require_model(model_id: str) -> None:
    # lazy: strop.control.models pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import models
    try:
        models.get(model_id)
    except StropError:
        raise StropError(f"MODEL {model_id!r}: no such tuned model; `strop models list` shows the tuned models, and "
                         f"`strop base-models list` the base models you can serve") from None
