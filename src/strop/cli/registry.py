"""`strop registry datasets|bundles register|list|get`: named, immutable versions of data and reward code."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, emit, format_table


def register(nouns) -> None:
    parser = nouns.add_parser("registry", help="register datasets and scoring bundles as immutable versions",
                              description="Datasets and scoring bundles, each a name with numbered, immutable "
                                          "versions. Refer to them as NAME (latest) or NAME@VERSION.")
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    for kind in ("datasets", "bundles"):
        _kind(kinds, kind)


def _kind(kinds, kind: str) -> None:
    what = "a JSONL/JSON/parquet file of rows with question and answer" if kind == "datasets" \
        else "a directory of Python modules, one or more of which define compute_score"
    p = kinds.add_parser(kind, help=f"{kind}: register, list, get, delete")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    example = ("strop registry datasets register gsm8k/train -f data/train.jsonl" if kind == "datasets"
               else "strop registry bundles register gsm8k/scoring -f scoring/\n"
                    "  (then use a module by name: bundle:gsm8k/scoring#MODULE:compute_score)")
    reg = verbs.add_parser("register", help=f"store {what} as a new version",
                           description=f"Store {what} as a new version of NAME. Content that a version of NAME "
                                       "already holds returns that version instead.",
                           epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter)
    reg.add_argument("name", metavar="NAME")
    reg.add_argument("-f", "--file", required=True, metavar="DIR" if kind == "bundles" else "FILE")
    if kind == "bundles":
        reg.add_argument("--module", help="check only this module (default: every top-level module that defines "
                                          "the function; at least one must)")
        reg.add_argument("--function", default="compute_score",
                         help="the grader function to look for and check (default: %(default)s)")
    add_output_flags(reg)
    reg.set_defaults(handler=lambda a: _register(a, kind))

    ls = verbs.add_parser("list", help=f"list registered {kind}", epilog=f"example:\n  strop registry {kind} list -o json",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(ls)
    ls.set_defaults(handler=lambda a: _list(a, kind))

    get = verbs.add_parser("get", help="show one version (NAME for the latest, NAME@VERSION)",
                           epilog=f"example:\n  strop registry {kind} get {'gsm8k/train@1' if kind == 'datasets' else 'gsm8k/scoring'}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    get.add_argument("ref", metavar="NAME[@VERSION]")
    add_output_flags(get)
    get.set_defaults(handler=lambda a: _get(a, kind))

    rm = verbs.add_parser("delete", help="delete one version (NAME@VERSION) or all of NAME; refused while in use",
                          description="Delete a version, or every version of NAME. Refused, naming the users, while "
                                      "a run, an evaluation or a project's evaluation settings refer to it.",
                          epilog=f"example:\n  strop registry {kind} delete {'gsm8k/train@1' if kind == 'datasets' else 'gsm8k/scoring@2'}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    rm.add_argument("ref", metavar="NAME[@VERSION]")
    add_output_flags(rm)
    rm.set_defaults(handler=lambda a: _delete(a, kind))


def _register(args, kind: str) -> int:
    # lazy: strop.control.registry pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import registry
    if kind == "datasets":
        result = registry.register_dataset(args.name, args.file)
    else:
        result = registry.register_bundle(args.name, args.file, args.module, args.function)
    emit(args, result, lambda r: f"{r['ref']} {'registered' if r['created'] else 'unchanged (same content)'}"
                                 f" sha256 {r['sha256'][:12]}")
    return 0


def _list(args, kind: str) -> int:
    # lazy: strop.control.registry pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import registry
    rows = registry.list_datasets() if kind == "datasets" else registry.list_bundles()
    columns = [("name", "NAME"), ("latestVersion", "LATEST"), ("versions", "VERSIONS")]
    if kind == "datasets":
        columns.append(("rows", "ROWS"))
    emit(args, rows, lambda rs: format_table(rs, columns + [("createdAt", "CREATED")]))
    return 0


def _get(args, kind: str) -> int:
    # lazy: strop.control.registry pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import registry
    result = registry.get_dataset(args.ref) if kind == "datasets" else registry.get_bundle(args.ref)
    emit(args, result, lambda r: "\n".join(f"{k}: {v}" for k, v in r.items()))
    return 0


def _delete(args, kind: str) -> int:
    # lazy: strop.control.registry pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import registry
    result = registry.delete(kind.rstrip("s"), args.ref)
    emit(args, result, lambda r: f"deleted {', '.join(r['deleted'])}")
    return 0
