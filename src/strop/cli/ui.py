"""`strop ui`: the web app over runs, rollouts and models, on this machine by default."""

from __future__ import annotations

import argparse
import os

from strop.cli.output import note
from strop.errors import StropError

TOKEN_ENV = "STROP_UI_TOKEN"


def register(nouns) -> None:
    p = nouns.add_parser("ui", help="a web app to watch runs, read rollouts and compare curves",
                         description="Serve a web app over the store and the run folders: every run with its "
                                     "status and latest reward (live), a run's curves, checkpoints, log, cancel and "
                                     "resume, and its rollouts page by page. Everything is served by strop itself.",
                         epilog="example:\n  strop ui --port 8765      # then open http://127.0.0.1:8765/\n"
                                "  STROP_UI_TOKEN=... strop ui --host 0.0.0.0   # others reach it with /?token=...",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only; "
                                                       "any other address needs a token)")
    p.add_argument("--port", type=int, default=8765, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--token", help=f"require this token on every request (default: ${TOKEN_ENV}); required when "
                                   "--host is not loopback")
    p.set_defaults(handler=run)


def run(args) -> int:
    # lazy: the server pulls in the control plane and the store, which the rest of the CLI's parsing does not need
    from strop.ui.server import make_server
    if not 0 <= args.port <= 65535:
        raise StropError(f"--port must be between 0 and 65535, got {args.port}")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        server = make_server(args.host, args.port, token)
    except OSError as exc:
        raise StropError(f"strop ui could not listen on {args.host}:{args.port}: {exc.strerror or exc}; pick "
                         "another --port (0 picks a free one)") from None
    shown = f"[{args.host}]" if ":" in args.host else args.host
    suffix = "/?token=<your token>" if token else "/"
    note(f"strop ui on http://{shown}:{server.server_port}{suffix} (Ctrl-C stops it)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
