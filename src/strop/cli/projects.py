"""`strop projects create|get|list|set-evaluation`: training projects and their evaluation settings."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, emit, format_table


def register(nouns) -> None:
    parser = nouns.add_parser("projects", help="create training projects and set their evaluation",
                              description="A training project groups runs and says how its models are evaluated.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    create = verbs.add_parser("create", help="create a project (refuses an existing name)",
                              epilog="example:\n  strop projects get gsm8k >/dev/null 2>&1 || strop projects create gsm8k",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    create.add_argument("name", metavar="NAME")
    add_output_flags(create)
    create.set_defaults(handler=_create)

    get = verbs.add_parser("get", help="show a project", epilog="example:\n  strop projects get gsm8k -o json",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    get.add_argument("name", metavar="NAME")
    add_output_flags(get)
    get.set_defaults(handler=_get)

    ls = verbs.add_parser("list", help="list projects", epilog="example:\n  strop projects list --jq '.[].name'",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(ls)
    ls.set_defaults(handler=_list)

    ev = verbs.add_parser("set-evaluation", help="set (overwrite) the project's evaluation dataset and grader",
                          epilog="example:\n  strop projects set-evaluation gsm8k --dataset gsm8k/eval "
                                 "--grader bundle:gsm8k/scoring#reward:compute_score",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("name", metavar="NAME")
    ev.add_argument("--dataset", required=True, help="registered dataset: NAME or NAME@VERSION")
    ev.add_argument("--grader", required=True, help="bundle:NAME[@VERSION]#MODULE:FUNCTION or builtin:gsm8k")
    add_output_flags(ev)
    ev.set_defaults(handler=_set_evaluation)


def _show(p: dict) -> str:
    ev = p["evaluation"]
    return (f"name: {p['name']}\nevaluation dataset: {ev['dataset'] or '-'}\nevaluation grader: {ev['grader'] or '-'}"
            f"\ncreated: {p['createdAt']}")


def _create(args) -> int:
    # lazy: strop.control.projects pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import projects
    emit(args, projects.create(args.name), lambda p: f"project {p['name']} created")
    return 0


def _get(args) -> int:
    # lazy: strop.control.projects pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import projects
    emit(args, projects.get(args.name), _show)
    return 0


def _list(args) -> int:
    # lazy: strop.control.projects pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import projects
    rows = [{**p, "dataset": p["evaluation"]["dataset"], "grader": p["evaluation"]["grader"]} for p in projects.list_all()]
    emit(args, rows, lambda rs: format_table(rs, [("name", "NAME"), ("dataset", "EVAL DATASET"), ("grader", "GRADER"),
                                                  ("createdAt", "CREATED")]))
    return 0


def _set_evaluation(args) -> int:
    # lazy: strop.control.projects pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import projects
    emit(args, projects.set_evaluation(args.name, args.dataset, args.grader), _show)
    return 0
