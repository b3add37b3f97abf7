"""How every command prints: `-o table` (default, for people), `-o json` / `-o yaml` (for scripts), and
`--jq EXPR` to pick from the JSON form (string results print bare, like `jq -r`, so
`RUN=$(strop runs start -f run.json -o json --jq .runId)` captures just the id).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from strop.errors import StropError


def add_output_flags(parser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table",
                        help="output format (default: table)")
    parser.add_argument("--jq", metavar="EXPR", help="jq expression over the JSON form, e.g. .runId")


def emit(args, data: Any, table: Callable[[Any], str] | None = None) -> None:
    if getattr(args, "jq", None):
        try:
            # lazy: optional, its absence is handled here
            import jq
            results = jq.compile(args.jq).input_value(json.loads(json.dumps(data, default=str))).all()
        except ValueError as exc:
            raise StropError(f"--jq {args.jq!r}: {exc}") from None
        for result in results:
            print(result if isinstance(result, str) else json.dumps(result, default=str))
        return
    fmt = getattr(args, "output", "table")
    if fmt == "json":
        print(json.dumps(data, indent=2, default=str))
    elif fmt == "yaml":
        # lazy: yaml is heavy or optional, loaded only when this runs
        import yaml
        print(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False).rstrip())
    else:
        print(table(data) if table else json.dumps(data, indent=2, default=str))


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain aligned table; columns are (key, HEADER)."""
    cells = [[h for _, h in columns]] + [[_cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def note(message: str) -> None:
    """Progress and hints go to stderr so stdout stays clean for -o json."""
    print(message, file=sys.stderr)


SAMPLER_HELP = ("which engine samples a local model: strop (its own decoder), vllm (pip install -e \".[vllm]\", or "
                "STROP_VLLM_PYTHON naming a Python that has it) or auto (default: vLLM on a CUDA GPU where installed, "
                "strop's decoder elsewhere, the faster on a CPU). Sets STROP_SAMPLER for the work this command starts")


def add_ray_flags(parser, env_workers: bool = False) -> None:
    """`--ray-address`, `--samplers` (and `--env-workers`): strop.cli.main puts them in STROP_RAY_ADDRESS,
    STROP_RAY_SAMPLERS and STROP_RAY_ENV_WORKERS, which every ServiceClient (and environment pool) reads."""
    parser.add_argument("--ray-address", metavar="auto|HOST:PORT",
                        help="sample on replicas on this Ray cluster, each taking a share of every batch (pip install "
                             "-e \".[ray]\"); \"auto\": the cluster `ray start --head` started on this machine")
    parser.add_argument("--samplers", type=int, metavar="N", help="sampler replicas on the Ray cluster (default: 1)")
    if env_workers:
        parser.add_argument("--env-workers", type=int, metavar="N",
                            help="environment workers on the Ray cluster (default: 0, environments in this process)")
    parser.set_defaults(ray_flags_set_environment=True)


def add_sampler_flag(parser) -> None:
    """`--sampler auto|strop|vllm` (strop.cli.main puts it in STROP_SAMPLER, which every ServiceClient reads)."""
    parser.add_argument("--sampler", choices=("auto", "strop", "vllm"), help=SAMPLER_HELP)
