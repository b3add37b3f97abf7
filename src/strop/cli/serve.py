"""`strop serve MODEL`: a base or tuned model as an OpenAI-compatible API on this machine."""

from __future__ import annotations

import argparse
import os

from strop.cli.output import note
from strop.errors import StropError


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
    p.set_defaults(handler=run)


def run(args) -> int:
    from strop.control.evaluations import resolve_model
    from strop.serve import make_server
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise StropError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    model = resolve_model(args.model)
    if model.get("openai"):
        raise StropError(f"{args.model!r} is already an endpoint; serve a modelId or a selected base model")
    server = make_server(model["baseModel"], base_path=model["basePath"], adapter=model["adapter"], host=args.host,
                         port=args.port, api_key=key, name=args.model)
    note(f"serving {args.model} on http://{args.host}:{server.server_port}/v1 (Ctrl-C stops it)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
