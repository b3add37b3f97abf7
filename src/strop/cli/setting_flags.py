"""Command-line flags generated from the settings' declarations (`strop.rl.settings.setting`): a setting with a
`flag` becomes that flag, its type, choices and help its field's, its default shown from the field.

    add_setting_flags(parser, GRPOConfig, SFTConfig)   # --group-size, --lr, ... once each
    values = given_settings(args, GRPOConfig)         # {"group_size": 4, ...}: the flags given, by field

Every flag defaults to None, so "given" and "left at the config's default" stay apart: a config's own default
applies where a flag is not given, and a flag one method does not take can be refused by name.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
import re
import types
import typing


def add_setting_flags(parser: argparse.ArgumentParser, *configs) -> None:
    """One flag per setting that declares one, over the config classes in order: a flag several declare is added
    once, with the first's help; a flag not every class declares is marked with the methods that take it
    (`grpo: ...`)."""
    flag_of = {name: flag for cls in configs for flag, name in cls.flags().items()}
    seen = set()
    for cls in configs:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            flag = f.metadata.get("flag")
            if not flag or flag in seen:
                continue
            seen.add(flag)
            takers = [other.METHOD for other in configs if flag in other.flags()]
            method = "" if len(takers) == len(configs) else "/".join(takers) + ": "
            text = method + _flag_words(f.metadata["help"], flag_of) + _default_words(f)
            kind = _value_type(hints[f.name])
            if kind is bool:
                parser.add_argument(flag, action="store_true", default=None, help=text)
                continue
            parser.add_argument(flag, type=f.metadata.get("parse") or kind, default=None, help=text,
                                choices=f.metadata.get("choices"), metavar=f.metadata.get("metavar"))


def given_settings(args: argparse.Namespace, cls) -> dict:
    """field -> value for each of `cls`'s flags that was given."""
    return {name: value for flag, name in cls.flags().items()
            if (value := getattr(args, _dest(flag), None)) is not None}


def given_flags(args: argparse.Namespace, cls) -> list[str]:
    """The flags of `cls` that were given, in declaration order."""
    return [flag for flag in cls.flags() if getattr(args, _dest(flag), None) is not None]


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _value_type(annotation):
    """int for `int | None`, list for `list`, ...: what a flag's text becomes."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_origin(annotation) or annotation


def _flag_words(text: str, flag_of: dict[str, str]) -> str:
    """A field's help as a flag's: the settings it names as fields (`max_completion_length`, or `epochs` in
    backticks: a one-word name is often a plain word) named by their flags."""
    names = "|".join(sorted(map(re.escape, flag_of), key=len, reverse=True))
    return re.sub(rf"`({names})`|(?<![\w-])({names})(?![\w-])",
                  lambda m: flag_of[m.group(1)] if m.group(1) else
                  (flag_of[m.group(2)] if "_" in m.group(2) else m.group(2)), text)


def _default_words(f) -> str:
    """' (default: 8)' from the field; nothing for a default that means "unset" (None, False, "")."""
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    if default is None or default is False or default == "":
        return ""
    shown = ",".join(default) if isinstance(default, list) else default
    return f" (default: {shown})"
