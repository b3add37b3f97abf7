"""`strop models list|get|delete`: the tuned models that finished runs registered."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, emit, format_table


def register(nouns) -> None:
    parser = nouns.add_parser("models", help="list, show and delete tuned models",
                              description="A run that succeeds registers its tuned model (the LoRA adapter on its "
                                          "base model) under a modelId. Example: strop models get model-2d69fb15")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="list tuned models, newest first", epilog="example:\n  strop models list -o json",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(ls)
    ls.set_defaults(handler=_list)
    for name, handler, help_ in (("get", _get, "show a model"), ("delete", _delete, "delete a model's record")):
        p = verbs.add_parser(name, help=help_, epilog=f"example:\n  strop models {name} model-2d69fb15",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("model", metavar="MODEL_ID")
        add_output_flags(p)
        p.set_defaults(handler=handler)


def _list(args) -> int:
    # lazy: strop.control.models pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import models
    emit(args, models.list_all(), lambda rs: format_table(rs, [("modelId", "MODEL"), ("runId", "RUN"),
                                                               ("baseModel", "BASE MODEL"), ("createdAt", "CREATED")]))
    return 0


def _get(args) -> int:
    # lazy: strop.control.models pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import models
    emit(args, models.get(args.model), lambda r: "\n".join(f"{k}: {v}" for k, v in r.items()))
    return 0


def _delete(args) -> int:
    # lazy: strop.control.models pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import models
    emit(args, models.delete(args.model), lambda r: f"model {r['modelId']} deleted")
    return 0
