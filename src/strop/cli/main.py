"""The `strop` command. One module per noun; each adds its subcommands to the parser here.

    strop base-models list
    strop train --base-model strop/tiny-random --dataset synthetic:add --steps 2

Errors a person can fix (StropError) print as one line on stderr and exit 1; nothing else is printed.
"""

from __future__ import annotations

import argparse
import os
import sys

from strop import __version__
from strop.cli import base_models, compare, envs, evaluations, models, projects, quickstart, registry, runs, serve, serve_tinker, train, ui
from strop.errors import StropError
from strop.scoring.confine import ALLOW_UNCONFINED_ENV


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strop",
        description="RL fine-tuning (GRPO + LoRA) of small open language models on tasks whose answers can be "
                    "checked. State lives under $STROP_HOME (default ~/.strop).",
        epilog="Start with: strop base-models list, then strop train --help.")
    parser.add_argument("--version", action="version", version=f"strop {__version__}")
    parser.add_argument("--allow-unconfined-graders", action="store_true",
                        help="run scoring bundles even where they cannot be confined (no bubblewrap or no user "
                             "namespaces): they then run with per-process limits only, and can read and write what "
                             "you can. Same as STROP_ALLOW_UNCONFINED_GRADERS=1; background runs inherit it.")
    nouns = parser.add_subparsers(dest="noun", metavar="COMMAND", required=True)
    registry.register(nouns)
    projects.register(nouns)
    runs.register(nouns)
    models.register(nouns)
    evaluations.register(nouns)
    compare.register(nouns)
    serve.register(nouns)
    serve_tinker.register(nouns)
    base_models.register(nouns)
    train.register(nouns)
    quickstart.register(nouns)
    envs.register(nouns)
    ui.register(nouns)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.allow_unconfined_graders:
        os.environ[ALLOW_UNCONFINED_ENV] = "1"  # the background workers this command starts inherit it
    for flag, variable in (("ray_address", "STROP_RAY_ADDRESS"), ("samplers", "STROP_RAY_SAMPLERS"),
                           ("env_workers", "STROP_RAY_ENV_WORKERS")):
        if getattr(args, "ray_flags_set_environment", False) and getattr(args, flag, None) is not None:
            os.environ[variable] = str(getattr(args, flag))  # the work this command starts, its workers too
    if os.environ.get("STROP_RAY_ADDRESS") and getattr(args, "ray_flags_set_environment", False) \
            and getattr(args, "ray_address", None):
        from strop.cluster.connect import reachable  # lazy: Ray is an extra
        from strop.cluster.settings import RaySettings
        try:
            RaySettings.from_environment()
            reachable(args.ray_address)  # now, in seconds: not after a background worker has started
        except StropError as exc:
            message = str(exc).replace("the Ray settings of this environment:", "invalid flags:")
            for variable, flag in (("STROP_RAY_ENV_WORKERS", "--env-workers"), ("STROP_RAY_SAMPLERS", "--samplers"),
                                   ("STROP_RAY_ADDRESS", "--ray-address")):
                message = message.replace(variable, flag)  # the flags set them: say what the person typed
            print(f"strop: error: {message if 'invalid flags' in message else '--ray-address: ' + message}",
                  file=sys.stderr)
            return 1
    if getattr(args, "sampler", None):
        os.environ["STROP_SAMPLER"] = args.sampler  # every sampling client of this command and its workers
    try:
        return args.handler(args) or 0
    except StropError as exc:
        print(f"strop: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("strop: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `strop ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
