"""finance-sql's answers: the number in a submitted answer ("12.5%", "$1,234.5", "USD 1.2bn"), whether it is the
gold value within the question's tolerance, and the two reward terms (correctness, format) built on them.

    parse_answer("USD 1.2bn")                      # ParsedAnswer(value=1200.0, percent=False)
    is_correct(parse_answer("22.5%"), 22.49, "percent")

Answers are hostile text: they are cut to ANSWER_CHARS and matched by a pattern that cannot backtrack badly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# Each \s* follows a sign or currency it belongs to, so a run of spaces can be matched one way only: with three
# optional groups each followed by a bare \s*, 400 spaces and an `x` took ~51 s (the splits of the run, at every
# start). Answers are also stripped and cut to ANSWER_CHARS before they are matched.
_NUMBER = re.compile(r"""
    (?:(?P<sign>[-+\u2212\u2013(])\s*)?
    (?:(?P<currency>US\$|\$|USD\b)\s*)?
    (?:(?P<sign2>[-+\u2212])\s*)?
    (?P<digits>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)
    (?:[eE](?P<exponent>[-+]?\d+))?
    (?:\s*(?P<unit>%|percentage\s+points?\b|per\s?cent\b|pp\b|billions?\b|bn\b|b\b|millions?\b|mn\b|mm\b|m\b
                    |thousands?\b|k\b))?
    """, re.IGNORECASE | re.VERBOSE)
_CLOSING = re.compile(r"\s*\)")
ANSWER_CHARS = 1000  # an answer is a number and a few words; characters past this are not read
_SCALE = {"b": 1000.0, "bn": 1000.0, "billion": 1000.0, "billions": 1000.0, "thousand": 0.001,
          "thousands": 0.001, "k": 0.001}  # answers are in USD millions; anything else is 1


@dataclass(frozen=True)
class ParsedAnswer:
    value: float    # in the question's unit: USD millions, percent points or a plain number
    percent: bool   # written with %, "percent" or "pp"


def parse_answer(answer: Any) -> ParsedAnswer | None:
    """The number in a submitted answer: "12.5", "12.5%", "$1,234.5", "1,234.5 million", "USD 1.2bn" (-> 1200),
    "(3.4)" (-> -3.4). With several numbers the first one that is not a bare year counts. Only the first
    ANSWER_CHARS characters (after surrounding space) are read; an infinite number is no number."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        try:
            value = float(answer)
        except OverflowError:  # an integer past float's range
            return None
        return ParsedAnswer(value, False) if math.isfinite(value) else None
    if not isinstance(answer, str):
        return None
    answer = answer.strip()[:ANSWER_CHARS]
    first_year = None
    for m in _NUMBER.finditer(answer):
        text = m.group("digits")
        value = float(text.replace(",", "") + (f"e{m.group('exponent')}" if m.group("exponent") else ""))
        if not math.isfinite(value):
            continue
        unit = (m.group("unit") or "").lower()
        signs = (m.group("sign") or "") + (m.group("sign2") or "")
        closing = _CLOSING.match(answer, m.end()) is not None
        if any(s in signs for s in "-\u2212\u2013") or ("(" in signs and closing):
            value = -value
        value *= _SCALE.get(unit, 1.0)
        if not math.isfinite(value):       # "1e308 billion": no number an answer could mean
            continue
        plain = not (unit or m.group("currency") or m.group("exponent") or "," in text or "." in text)
        parsed = ParsedAnswer(value, unit.startswith(("%", "per", "pp")))
        if not (plain and 1900 <= abs(value) <= 2100):
            return parsed
        first_year = first_year or parsed
    return first_year


def is_correct(parsed: ParsedAnswer | None, gold: float, unit: str) -> bool:
    """Right when the relative error is at most 1% and the absolute error at most 1.0. A percentage may also be
    given as a fraction (0.125 for 12.5%); a ratio may be given as a percentage (45% for 0.45)."""
    if parsed is None:
        return False
    candidates = [parsed.value]
    if unit == "percent" and not parsed.percent:
        candidates.append(parsed.value * 100)
    if unit == "ratio" and parsed.percent:
        candidates.append(parsed.value / 100)
    return any(abs(c - gold) <= 1.0 and abs(c - gold) <= 0.01 * abs(gold) for c in candidates)


def correctness_reward(answer: Any, gold: float, unit: str) -> float:
    return float(is_correct(parse_answer(answer), gold, unit))


def format_reward(answer: Any) -> float:
    """1 when the answer was submitted as a parseable number (weighted by `format_weight`)."""
    return float(parse_answer(answer) is not None)
