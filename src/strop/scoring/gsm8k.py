"""The built-in GSM8K grader: pull the final number out of a completion and compare it with the gold answer.

A completion's answer is its last *marked* answer — `#### N` or `\\boxed{N}`, whichever comes last — or, when it
marks none, the last number it mentions. Numbers are read the way people write them: `1,234`, `$18`, `18.`,
`18.0`, `-3`, `18 dollars`, `\\boxed{\\$18}`, `\\boxed{18\\%}`, `\\boxed{\\frac{1}{2}}`. Both sides are compared
as numbers (within 1e-6), so `18.00` matches a gold of `18`.

    >>> from strop.scoring.gsm8k import compute_score, extract_answer
    >>> extract_answer("3 + 4 = 7 apples, so ... #### 7")
    '7'
    >>> compute_score(solution_str="The total is \\\\boxed{1,234}.", ground_truth="... #### 1234")
    1.0

`format_score` (same signature) is 1.0 when the completion marks an answer at all: a format term that teaches
a small model to end with `#### N` before it can get answers right.

`####` counts as a marker only when a number follows it directly (spaces, `:`, `*` and `$` aside), so a Markdown
heading such as `#### Step 1: add the apples` is not mistaken for the answer 1.

Completions are model output, so reading one takes bounded time whatever it holds: the text is stripped and
only its last MAX_ANSWER_CHARS characters are read (the final answer is at the end), a `\\boxed{}` counts its
first MAX_BOX_CHARS characters, braces are matched in one pass, and a "number" longer than MAX_NUMBER_CHARS is
not an answer anyone wrote.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

TOLERANCE = Decimal("1e-6")
MAX_ANSWER_CHARS = 16_384   # of a completion's end (about 4,000 tokens); a ground truth's answer is read likewise
MAX_BOX_CHARS = 256
MAX_NUMBER_CHARS = 100      # digits, commas and point; longer runs also overflow Decimal's exponent when compared

# Thousands groups only in runs of three, so "1,2,3" (a list) reads as three numbers, not 123.
_NUMBER = re.compile(
    r"(?P<sign>[-\u2212])?\$?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)
_HASH_MARK = re.compile(r"####[ \t*:]*" + _NUMBER.pattern)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_BRACE = re.compile(r"[{}]")
_SPACE = re.compile(r"\s")


def extract_answer(text: str | None) -> str | None:
    """The completion's final answer as a plain number string ('1234', '-3', '0.5'), or None if it has none."""
    if not text:
        return None
    text = _answer_part(text)
    marked = _marked_answers(text)
    if marked:
        return marked[-1][1]
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


def gold_answer(ground_truth: object) -> str:
    """The gold number: the first number after the last `####` in `ground_truth`, else its final answer.

    Raises ValueError when there is no number: a grader cannot score against it and the dataset needs fixing.
    """
    if ground_truth is None:
        raise ValueError("ground_truth is missing: the row's answer must end with '#### N'")
    text = str(ground_truth)
    _, marker, tail = text.rpartition("####")
    numbers = _numbers(tail.strip()[:MAX_ANSWER_CHARS]) if marker else []
    found = numbers[0] if numbers else (None if marker else extract_answer(text))
    if found is None:
        shown = text if len(text) <= 80 else "..." + text[-77:]
        raise ValueError(f"ground truth {shown!r} has no number to compare with: end the answer with '#### N'")
    return found


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None) -> float:
    """1.0 when the completion's final answer equals the gold answer numerically, else 0.0."""
    gold = gold_answer(ground_truth)
    got = extract_answer(solution_str)
    if got is None:
        return 0.0
    return 1.0 if abs(Decimal(got) - Decimal(gold)) < TOLERANCE else 0.0


def format_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None) -> float:
    """1.0 when the completion marks a numeric answer with `#### N` or `\\boxed{N}`, else 0.0."""
    return 1.0 if solution_str and _marked_answers(_answer_part(solution_str)) else 0.0


def _answer_part(text: str) -> str:
    """The stripped text, or its last MAX_ANSWER_CHARS characters from the first whitespace among them (so the
    cut does not leave half a number)."""
    text = text.strip()
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    text = text[-MAX_ANSWER_CHARS:]
    space = _SPACE.search(text, 0, 64)
    return text[space.end():] if space else text


def _marked_answers(text: str) -> list[tuple[int, str]]:
    """(position, number) for each `#### N` and `\\boxed{...N...}` in the text, in order of position."""
    found = []
    for m in _HASH_MARK.finditer(text):
        value = _to_number(m, text)
        if value is not None:
            found.append((m.start(), value))
    closers = None
    for m in _BOX_OPEN.finditer(text):
        closers = _closing_braces(text) if closers is None else closers
        end = closers.get(m.end() - 1)
        if end is None:  # never closed
            continue
        numbers = _numbers(_unlatex(text[m.end():min(end, m.end() + MAX_BOX_CHARS)]))
        if numbers:
            found.append((m.start(), numbers[0]))
    return sorted(found)


def _closing_braces(text: str) -> dict[int, int]:
    """For the index of each '{' that is closed, the index of the '}' that closes it: one pass, however deep."""
    open_at, closing = [], {}
    for m in _BRACE.finditer(text):
        if m.group() == "{":
            open_at.append(m.start())
        elif open_at:
            closing[open_at.pop()] = m.start()
    return closing


def _unlatex(content: str) -> str:
    def frac(m: re.Match) -> str:
        num, den = Decimal(m.group(1)), Decimal(m.group(2))
        return _canonical(num / den) if den else m.group(0)

    content = _FRAC.sub(frac, content)
    content = _TEXT.sub(r" \1", content)
    # LaTeX spells thousands separators and currency/percent signs with escapes.
    for old, new in (("{,}", ","), ("\\,", ""), ("\\!", ""), ("\\$", "$"), ("\\%", "%"), ("\\ ", " ")):
        content = content.replace(old, new)
    return content


def _numbers(text: str) -> list[str]:
    return [v for v in (_to_number(m, text) for m in _NUMBER.finditer(text)) if v is not None]


def _to_number(m: re.Match, text: str) -> str | None:
    if len(m.group("num")) > MAX_NUMBER_CHARS:
        return None
    try:
        value = Decimal(m.group("num").replace(",", ""))
    except InvalidOperation:
        return None
    sign_at = m.start("sign")
    # A minus right after a digit, letter or bracket is subtraction or a range ("3-4"), not a sign.
    if sign_at >= 0 and not (sign_at > 0 and (text[sign_at - 1].isalnum() or text[sign_at - 1] in ")]}")):
        value = -value
    return _canonical(value)


def _canonical(value: Decimal) -> str:
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text
