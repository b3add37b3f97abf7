"""Names people give things, checked wherever they are accepted: they are stored in the database and printed in
tables, logs and errors, so a name may not hide what it is.

Two kinds:
- registry names (datasets, bundles, projects): '/'-separated segments, each starting with a letter or digit and
  then letters, digits, '.', '_' or '-' (so never '.' or '..'); at most 200 characters; NAME@VERSION refers to
  one version;
- labels (a run's configName, a reward term's name, a base-model id, an environment name): free text, at most
  200 characters (1,000 for an environment name, which may be a URL), without control characters, invisible
  formatting characters or bidirectional overrides (U+202E turns 'txt.exe' into 'exe.txt' on screen).

    >>> registry_name_problem("gsm8k/../train")
    "its segment '..' is not a name: each '/'-separated part starts with a letter or digit, ..."
    >>> label_problem("report\\u202etxt")
    'it holds U+202E (RIGHT-TO-LEFT OVERRIDE) at character 7; names may not hold control, formatting or ...'

Each returns None for a good name, else the reason (without the name: callers say which input it was). `shown`
gives a name as it may be printed: shortened, with those characters escaped.
"""

from __future__ import annotations

import re
import unicodedata

MAX_NAME_CHARS = 200  # the store's name columns (strop.store.schema.NAME_LEN)
SHOWN_CHARS = 60
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Cc: control (newline, escape), Cf: format (bidi overrides and isolates, zero-width), Zl/Zp: line and paragraph
# separators, Cs: lone surrogates, Co: private use (renders as anything)
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
REGISTRY_RULE = ("each '/'-separated part starts with a letter or digit, then letters, digits, '.', '_' or '-' "
                 f"(e.g. gsm8k/train), at most {MAX_NAME_CHARS} characters in all")


def hidden_character(text: str) -> tuple[int, str] | None:
    """(index, 'U+202E (RIGHT-TO-LEFT OVERRIDE)') of the first character that would not show as itself."""
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            return i, f"U+{ord(ch):04X} ({unicodedata.name(ch, 'a control character')})"
    return None


def label_problem(text: object, *, max_chars: int = MAX_NAME_CHARS) -> str | None:
    """Why `text` cannot be a name (a label), or None."""
    if not isinstance(text, str):
        return "it is not a string"
    if not text.strip():
        return "it is empty"
    if len(text) > max_chars:
        return f"it is {len(text):,} characters; at most {max_chars:,}"
    found = hidden_character(text)
    if found:
        return (f"it holds {found[1]} at character {found[0] + 1}; names may not hold control, formatting or "
                "bidirectional characters, which print as something else or nothing")
    return None


def registry_name_problem(name: object) -> str | None:
    """Why `name` cannot be a registry name (dataset, bundle, project), or None. The one rule for all of them,
    wherever they are accepted (the registry, projects, run descriptors)."""
    if not isinstance(name, str):
        return "it is not a string"
    if not name:
        return "it is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"it is {len(name):,} characters; at most {MAX_NAME_CHARS:,}"
    found = hidden_character(name)
    if found:
        return f"it holds {found[1]} at character {found[0] + 1}; {REGISTRY_RULE}"
    for segment in name.split("/"):
        if not segment:
            return f"it has an empty part ('//', or '/' at an end); {REGISTRY_RULE}"
        if not _SEGMENT.fullmatch(segment):
            kind = "is not a name" if segment in (".", "..") else "is not allowed"
            return f"its segment {shown(segment)} {kind}: {REGISTRY_RULE}"
    return None


def registry_ref_problem(ref: object) -> str | None:
    """Why `ref` cannot be NAME or NAME@VERSION (VERSION a number >= 1), or None."""
    if not isinstance(ref, str):
        return "it is not a string"
    name, at, version = ref.partition("@")
    problem = registry_name_problem(name)
    if problem:
        return problem
    if at and not (version.isascii() and version.isdigit() and int(version) >= 1):
        return f"the part after '@' must be a version number >= 1, e.g. {name[:SHOWN_CHARS]}@1"
    return None


def escape_hidden(text: str) -> str:
    """`text` with each character that would not show as itself written as \\uXXXX."""
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in _HIDDEN_CATEGORIES else ch for ch in text)


def shown(text: object, limit: int = SHOWN_CHARS) -> str:
    """`text` quoted for a message: cut to `limit` characters, hidden characters escaped (never printed raw)."""
    text = str(text)
    cut = text if len(text) <= limit else text[:limit - 3]
    return f"'{escape_hidden(cut)}'" + ("..." if cut is not text else "")
