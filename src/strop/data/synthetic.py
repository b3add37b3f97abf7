"""Seeded synthetic arithmetic problems, from bare sums up to multi-step word problems.

A curriculum for tiny models: a 135M model cannot learn GSM8K from scratch, but it can learn `add`, then
`mixed`, then `word-1`, and so on. Every answer is in GSM8K's form (short worked reasoning, then `#### N`), so
the same grader scores all levels. Answers are non-negative integers at every level.

    >>> from strop.data.synthetic import generate
    >>> row = generate("add", 1, seed=0)[0]
    >>> row.question, row.gold            # e.g. ('What is 12 + 13?', '25')

`generate(level, n, seed)` is deterministic: it uses only `random.Random(seed)`. With `split="train"` or
`split="test"` the problems come from two disjoint halves of the problem space (split by a stable hash of the
question text), so a test set never repeats a training question even at levels with few distinct problems.
"""

from __future__ import annotations

import random
import zlib
from typing import Callable

from strop.data.row import Row
from strop.errors import DatasetError

LEVELS: dict[str, str] = {
    "add": "bare addition of two numbers up to 20: 'What is 7 + 12?'",
    "add-sub": "bare addition or subtraction of numbers up to 50, never below zero: 'What is 41 - 17?'",
    "mul": "single-digit multiplication: 'Compute 6 * 7.'",
    "mixed": "two operations with precedence or parentheses: 'What is 3 + 4 * 5?'",
    "word-1": "one-step word problems with names and objects (add, subtract, multiply, share equally)",
    "word-2": "two-step word problems",
    "word-3": "multi-step word problems (three or more operations)",
}
DEFAULT_LEVEL = "add"
MAX_GENERATED = 1_000_000  # problems a call may generate; each is kept in memory

# One question in TEST_SHARE lands in the test half. Half and half: `add` has only 441 distinct problems, and a
# held-out evaluation needs at least 200 distinct ones (about 220 land in the test half).
TEST_SHARE = 2

# Pronouns travel with names so the word problems read naturally.
_PEOPLE = [
    ("Mia", "she"), ("Liam", "he"), ("Ava", "she"), ("Noah", "he"), ("Zoe", "she"), ("Omar", "he"),
    ("Lena", "she"), ("Ravi", "he"), ("Sofia", "she"), ("Kenji", "he"), ("Amara", "she"), ("Diego", "he"),
]
_THINGS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "books", "beads"]
_CONTAINERS = ["boxes", "bags", "jars", "baskets", "packs", "trays"]
_ITEMS_PRICED = ["notebooks", "markers", "apples", "tickets", "comics", "candles"]


def _row(question: str, steps: list[str], result: int, level: str) -> Row:
    if result < 0 or result != int(result):
        raise AssertionError(f"generator bug: level {level} produced {result} for {question!r}")
    answer = "\n".join(steps + [f"#### {result}"])
    return Row(question=question, answer=answer, extra={"level": level})


def _add(rng: random.Random) -> Row:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    return _row(f"What is {a} + {b}?", [f"{a} + {b} = {a + b}"], a + b, "add")


def _add_sub(rng: random.Random) -> Row:
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    if rng.random() < 0.5:
        return _row(f"What is {a} + {b}?", [f"{a} + {b} = {a + b}"], a + b, "add-sub")
    a, b = max(a, b), min(a, b)
    return _row(f"What is {a} - {b}?", [f"{a} - {b} = {a - b}"], a - b, "add-sub")


def _mul(rng: random.Random) -> Row:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return _row(f"Compute {a} * {b}.", [f"{a} * {b} = {a * b}"], a * b, "mul")


def _mixed(rng: random.Random) -> Row:
    a, b, c = rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 12)
    form = rng.randrange(5)
    if form == 0:
        q, steps, r = f"{a} + {b} * {c}", [f"{b} * {c} = {b * c}", f"{a} + {b * c} = {a + b * c}"], a + b * c
    elif form == 1:
        q, steps, r = f"({a} + {b}) * {c}", [f"{a} + {b} = {a + b}", f"{a + b} * {c} = {(a + b) * c}"], (a + b) * c
    elif form == 2:
        # Chosen so the difference never goes negative.
        c = rng.randint(0, a * b)
        q, steps, r = f"{a} * {b} - {c}", [f"{a} * {b} = {a * b}", f"{a * b} - {c} = {a * b - c}"], a * b - c
    elif form == 3:
        a = rng.randint(b, b + 20)
        q, steps, r = f"{a} - {b} + {c}", [f"{a} - {b} = {a - b}", f"{a - b} + {c} = {a - b + c}"], a - b + c
    else:
        q, steps, r = f"{a} * {b} + {c}", [f"{a} * {b} = {a * b}", f"{a * b} + {c} = {a * b + c}"], a * b + c
    return _row(f"What is {q}?", steps, r, "mixed")


def _word_1(rng: random.Random) -> Row:
    name, she = rng.choice(_PEOPLE)
    thing = rng.choice(_THINGS)
    form = rng.randrange(4)
    if form == 0:
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        q = f"{name} has {a} {thing}. {she.capitalize()} gets {b} more. How many {thing} does {name} have now?"
        return _row(q, [f"{name} has {a} + {b} = {a + b} {thing} now."], a + b, "word-1")
    if form == 1:
        a = rng.randint(5, 60)
        b = rng.randint(1, a)
        q = (f"{name} has {a} {thing}. {she.capitalize()} gives away {b} of them. "
             f"How many {thing} does {name} have left?")
        return _row(q, [f"{name} has {a} - {b} = {a - b} {thing} left."], a - b, "word-1")
    if form == 2:
        box = rng.choice(_CONTAINERS)
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        q = f"{name} has {a} {box} with {b} {thing} in each. How many {thing} does {name} have in total?"
        return _row(q, [f"{name} has {a} * {b} = {a * b} {thing}."], a * b, "word-1")
    k, each = rng.randint(2, 8), rng.randint(2, 12)
    total = k * each
    q = (f"{name} shares {total} {thing} equally among {k} friends. "
         f"How many {thing} does each friend get?")
    return _row(q, [f"Each friend gets {total} / {k} = {each} {thing}."], each, "word-1")


def _word_2(rng: random.Random) -> Row:
    name, she = rng.choice(_PEOPLE)
    thing = rng.choice(_THINGS)
    form = rng.randrange(4)
    if form == 0:
        box = rng.choice(_CONTAINERS)
        a, k, each = rng.randint(1, 30), rng.randint(2, 6), rng.randint(2, 10)
        q = (f"{name} has {a} {thing}. {she.capitalize()} buys {k} {box} with {each} {thing} in each. "
             f"How many {thing} does {name} have now?")
        steps = [f"{she.capitalize()} buys {k} * {each} = {k * each} {thing}.",
                 f"{name} now has {a} + {k * each} = {a + k * each} {thing}."]
        return _row(q, steps, a + k * each, "word-2")
    if form == 1:
        rate, hours = rng.randint(5, 20), rng.randint(2, 8)
        spent = rng.randint(0, rate * hours)
        q = (f"{name} earns ${rate} per hour and works {hours} hours. Then {she} spends ${spent} on lunch. "
             f"How many dollars does {name} have left?")
        steps = [f"{name} earns {rate} * {hours} = {rate * hours} dollars.",
                 f"{she.capitalize()} has {rate * hours} - {spent} = {rate * hours - spent} dollars left."]
        return _row(q, steps, rate * hours - spent, "word-2")
    if form == 2:
        trays, per = rng.randint(2, 6), rng.randint(4, 12)
        sold = rng.randint(0, trays * per)
        q = (f"A baker named {name} bakes {trays} trays of {per} muffins each and sells {sold} muffins. "
             f"How many muffins are left?")
        steps = [f"{name} bakes {trays} * {per} = {trays * per} muffins.",
                 f"{trays * per} - {sold} = {trays * per - sold} muffins are left."]
        return _row(q, steps, trays * per - sold, "word-2")
    k, each, extra = rng.randint(2, 6), rng.randint(2, 10), rng.randint(1, 15)
    total = k * each
    q = (f"{name} splits {total} {thing} equally into {k} piles, then adds {extra} more {thing} to one pile. "
         f"How many {thing} are in that pile now?")
    steps = [f"Each pile starts with {total} / {k} = {each} {thing}.",
             f"That pile now has {each} + {extra} = {each + extra} {thing}."]
    return _row(q, steps, each + extra, "word-2")


def _word_3(rng: random.Random) -> Row:
    name, she = rng.choice(_PEOPLE)
    form = rng.randrange(3)
    if form == 0:
        many_a, many_b = rng.sample(_ITEMS_PRICED, 2)
        na, pa, nb, pb = rng.randint(2, 6), rng.randint(1, 9), rng.randint(2, 6), rng.randint(1, 9)
        cost_a, cost_b = na * pa, nb * pb
        bill = rng.choice([b for b in (20, 50, 100) if b >= cost_a + cost_b])
        q = (f"{name} buys {na} {many_a} at ${pa} each and {nb} {many_b} at ${pb} each. "
             f"{she.capitalize()} pays with a ${bill} bill. How many dollars of change does {she} get?")
        steps = [f"The {many_a} cost {na} * {pa} = {cost_a} dollars.",
                 f"The {many_b} cost {nb} * {pb} = {cost_b} dollars.",
                 f"Together they cost {cost_a} + {cost_b} = {cost_a + cost_b} dollars.",
                 f"The change is {bill} - {cost_a + cost_b} = {bill - cost_a - cost_b} dollars."]
        return _row(q, steps, bill - cost_a - cost_b, "word-3")
    if form == 1:
        pens, sheep = rng.randint(2, 6), rng.randint(3, 10)
        start = pens * sheep
        sold = rng.randint(1, start)
        bought = rng.randint(1, 20)
        q = (f"{name} has {pens} pens with {sheep} sheep in each. {she.capitalize()} sells {sold} sheep "
             f"and then buys {bought} more. How many sheep does {name} have now?")
        steps = [f"{name} starts with {pens} * {sheep} = {start} sheep.",
                 f"After selling, {she} has {start} - {sold} = {start - sold} sheep.",
                 f"After buying, {she} has {start - sold} + {bought} = {start - sold + bought} sheep."]
        return _row(q, steps, start - sold + bought, "word-3")
    thing = rng.choice(_THINGS)
    bags, per_bag = rng.randint(2, 5), rng.randint(4, 12)
    total = bags * per_bag
    friends = rng.randint(2, min(6, total // 2))
    # `keep` is picked so the rest divides evenly among the friends and each friend gets at least one.
    rest_mod = total % friends
    first = 1 if rest_mod == 0 else 0
    last = max(first, (total - friends - rest_mod) // friends)
    keep = rest_mod + friends * rng.randint(first, last)
    each = (total - keep) // friends
    self_ = "herself" if she == "she" else "himself"
    q = (f"{name} buys {bags} bags of {thing} with {per_bag} {thing} in each bag. {she.capitalize()} keeps "
         f"{keep} {thing} for {self_} and shares the rest equally among {friends} friends. "
         f"How many {thing} does each friend get?")
    steps = [f"{name} buys {bags} * {per_bag} = {total} {thing}.",
             f"After keeping some, {total} - {keep} = {total - keep} {thing} are left.",
             f"Each friend gets {total - keep} / {friends} = {each} {thing}."]
    return _row(q, steps, each, "word-3")


_MAKERS: dict[str, Callable[[random.Random], Row]] = {
    "add": _add, "add-sub": _add_sub, "mul": _mul, "mixed": _mixed,
    "word-1": _word_1, "word-2": _word_2, "word-3": _word_3,
}


def in_test_half(question: str) -> bool:
    """True when `question` belongs to the test half of the problem space (stable across runs and machines)."""
    return zlib.crc32(question.encode("utf-8")) % TEST_SHARE == 0


def generate(level: str, n: int, seed: int, *, split: str | None = None) -> list[Row]:
    """`n` problems of `level`, deterministic in `seed`.

    `split=None` draws from the whole problem space; "train" and "test" draw from disjoint halves, each with its
    own random stream, so train and test never share a question.
    """
    if level not in _MAKERS:
        known = ", ".join(LEVELS)
        shown = level if len(level) <= 60 else level[:57] + "..."
        raise DatasetError(f"unknown synthetic level {shown!r}: choose one of {known} (e.g. 'synthetic:word-1').")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_GENERATED:
        raise DatasetError(f"synthetic problem count must be a whole number from 0 to {MAX_GENERATED:,} (they are "
                           f"generated into memory), got {n!r}.")
    if split not in (None, "train", "test"):
        raise DatasetError(f"synthetic data has splits 'train' and 'test', got split={split!r}.")
    # A string seed is hashed with SHA-512 by `random`, so the test stream is stable and unrelated to train's.
    rng = random.Random(seed if split in (None, "train") else f"test:{seed}")
    make = _MAKERS[level]
    rows: list[Row] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * (n + 10):
            raise AssertionError(f"generator bug: level {level} cannot fill the {split} half")
        row = make(rng)
        if split is not None and in_test_half(row.question) != (split == "test"):
            continue
        rows.append(row)
    return rows
