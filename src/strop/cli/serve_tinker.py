"""`strop serve-tinker`: the tinker SDK's wire protocol on this machine, so Tinker code runs here unchanged."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from strop.errors import StropError
from strop.paths import strop_home


def register(nouns) -> None:
    p = nouns.add_parser(
        "serve-tinker", help="serve the tinker SDK's API (training, sampling, checkpoints) from this machine",
        description="Run a server that the unmodified `tinker` Python SDK talks to: set TINKER_BASE_URL to its URL "
                    "and TINKER_API_KEY to a key starting with 'tml-', and ServiceClient, TrainingClient, "
                    "SamplingClient and RestClient work as against Thinking Machines' service, with LoRA training "
                    "and sampling on strop's engine. Checkpoints (tinker:// paths) are folders under "
                    "$STROP_HOME/tinker and survive a restart.",
        epilog="example:\n  export STROP_TINKER_KEYS=tml-$(openssl rand -hex 16)\n"
               "  strop serve-tinker --port 8100 --api-key-env STROP_TINKER_KEYS &\n"
               "  TINKER_BASE_URL=http://127.0.0.1:8100 TINKER_API_KEY=$STROP_TINKER_KEYS python my_loop.py\n\n"
               "--api-key-env names the variable holding the accepted key(s), one per tenant; each key sees only "
               "its own sessions and checkpoints and has its own quota (16 sessions, 4 training models). Without "
               "it the server is open: any 'tml-' key is accepted (each still sees only its own work) and the "
               "quotas are per client address, since made-up keys cost nothing; behind a proxy all clients share "
               "one address. An open server binds only to this machine unless --open says so: on any other "
               "--host without --api-key-env it does not start.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8100, help="port (default: %(default)s; 0 takes a free one)")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="accept only the key(s) in environment variable VAR (several separated by commas); "
                        "quotas are per key")
    p.add_argument("--open", action="store_true",
                   help="accept any key starting with 'tml-' (each key still sees only its own work), with "
                        "sessions and training models counted per client address: the default on loopback, "
                        "needed to serve other machines without --api-key-env")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="what training computes in (default: %(default)s, bf16 where the CPU or GPU has it)")
    p.add_argument("--queued-mib-per-key", type=int, default=256, metavar="MIB",
                   help="request data (forward_backward bodies) one API key may have waiting to run, in MiB; a "
                        "request over it is answered 429 until earlier ones ran (default: %(default)s)")
    p.add_argument("--results-mib-per-key", type=int, default=512, metavar="MIB",
                   help="finished results one API key's requests may hold on the server, in MiB; past it the "
                        "oldest are evicted and reading one says so (default: %(default)s)")
    p.add_argument("--queued-tokens-per-key", type=int, default=1 << 19, metavar="N",
                   help="sampled tokens (num_samples x max_tokens) one API key may have waiting; over it a 429 "
                        "(default: %(default)s)")
    p.add_argument("--sample-batch-tokens", type=int, default=8192, metavar="N",
                   help="sampled tokens one sampling batch takes, the keys' requests in turn, a long request a "
                        "chunk at a time (seeded samples draw the same tokens): a newcomer waits for one batch, not "
                        "another key's whole queue or request; smaller is fairer, larger batches more and re-reads "
                        "less (default: %(default)s)")
    p.add_argument("--log-jobs", action="store_true",
                   help="print a line per job run (kind, session, seconds) and per sampling batch, on stderr")
    p.set_defaults(handler=run)


def run(args) -> int:
    # lazy: the server's modules (and torch behind them) load when it runs, not when `strop --help` parses
    from strop.serve.guard import is_loopback
    from strop.serve.server import exposure_warning
    if not 0 <= args.port <= 65535:
        raise StropError(f"--port must be 0..65535, got {args.port}")
    keys = None
    if args.open and args.api_key_env:
        raise StropError("--open and --api-key-env exclude each other: --api-key-env accepts only its keys, --open "
                         "any key; pass one")
    if not args.open and not args.api_key_env and not is_loopback(args.host):
        raise StropError(f"--host {args.host} serves other machines: pass --api-key-env VAR (accept only the "
                         "key(s) in $VAR, e.g. VAR=tml-$(openssl rand -hex 16)) or --open (any 'tml-' key, quotas "
                         "per client address)")
    if not args.api_key_env:
        print("strop serve-tinker: open mode, any 'tml-' key is accepted with quotas per client address "
              "(--api-key-env VAR accepts only your keys)", file=sys.stderr)
    if args.api_key_env:
        value = os.environ.get(args.api_key_env, "")
        keys = {k.strip() for k in value.split(",") if k.strip()}
        if not keys:
            raise StropError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
        if any(not k.startswith("tml-") for k in keys):
            raise StropError(f"--api-key-env {args.api_key_env}: the tinker SDK only sends keys that start with "
                             "'tml-'; use such keys")
    warning = exposure_warning(args.host, "set" if keys else None, key_flag="--api-key-env VAR instead of --open")
    if warning:
        print(warning, file=sys.stderr)
    try:
        # lazy: the SDK's message definitions are an optional extra
        import tinker  # noqa: F401
    except ImportError:
        raise StropError("strop serve-tinker needs the tinker SDK's protocol definitions: "
                         "pip install 'strop[tinker]'") from None
    # lazy: the engine, starlette, the store and the SDK's types load only here
    from strop.control.tinker_checkpoints import register_checkpoint
    from strop.tinker_wire.app import TinkerServer, make_tinker_app
    from strop.tinker_wire.service import TinkerService
    log = (lambda line: print(f"strop serve-tinker: {line}", file=sys.stderr, flush=True)) if args.log_jobs else None
    service = TinkerService(strop_home() / "tinker", dtype=args.dtype, log=log, start_worker=False,
                            register_checkpoint=register_checkpoint,
                            queued_bytes_per_key=max(1, args.queued_mib_per_key) << 20,
                            result_bytes_per_key=max(1, args.results_mib_per_key) << 20,
                            queued_tokens_per_key=max(1, args.queued_tokens_per_key),
                            sample_batch_tokens=max(1, args.sample_batch_tokens))
    server = TinkerServer(make_tinker_app(service, api_keys=keys, open_mode=keys is None), host=args.host,
                          port=args.port).start()
    print(f"strop: tinker API at {server.url}  (TINKER_BASE_URL={server.url}; checkpoints under "
          f"{strop_home() / 'tinker'}; Ctrl-C stops)", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        service.work()          # the computing happens on this, the main, thread; HTTP is served from another
    except (KeyboardInterrupt, _Terminated):
        pass                    # the job running now, if any, was interrupted where it stood
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # every unfinished request is answered "the server stopped" before HTTP closes (within its 5 s grace)
        server.stop()
    return 0


class _Terminated(BaseException):
    """SIGTERM, raised on the main thread wherever it is, as Ctrl-C is: a job that runs for minutes is not waited
    for (a BaseException, so the worker's error handling does not take it for the job's own failure)."""


def _terminate(*_) -> None:
    raise _Terminated()
