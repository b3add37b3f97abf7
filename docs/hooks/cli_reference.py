"""MkDocs hook: the CLI reference page (reference/cli.md), generated at build time from strop's own parser, so it
says what `strop CMD --help` says today and cannot go stale. Each command's section is that command's help text.
The file in the repository is a stub (what GitHub shows); the built page's text is replaced by the generated one.

It documents the checkout it sits in: `src/` goes first on the path, whatever strop is installed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/cli.md"
WIDTH = "86"  # argparse wraps help to $COLUMNS: fixed, so the page does not depend on the terminal that built it


def _commands(parser: argparse.ArgumentParser, path: list[str]):
    """(['strop', 'runs', 'start'], parser) for every command and subcommand, in the parser's order."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its subcommands here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, [*path, name])


def render() -> str:
    if str(ROOT / "src") not in sys.path:  # `mkdocs serve` renders again in the same process
        sys.path.insert(0, str(ROOT / "src"))
    os.environ["COLUMNS"] = WIDTH
    os.environ["NO_COLOR"] = "1"  # Python 3.14's argparse colours help on a terminal
    from strop.cli.main import build_parser  # here, not at the top: the path above must be set first

    lines = ["# CLI reference", "",
             "Generated from `strop`'s parser when this site is built: each section is what `strop COMMAND --help` "
             "prints. Every command takes `-o table|json|yaml` and `--jq EXPR` where it prints a result, exits 0 on "
             "success and non-zero with a one-line reason on stderr otherwise.", ""]
    for path, parser in _commands(build_parser(), ["strop"]):
        level = max(2, min(len(path), 4))  # strop and its nouns h2, their verbs h3, registry's verbs h4
        lines += [f"{'#' * level} `{' '.join(path)}`", "", "```text",
                  parser.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    return render() if page.file.src_uri == PAGE else markdown
