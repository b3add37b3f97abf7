"""One problem of a dataset, as every loader (files, GSM8K, the synthetic generator) gives it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    """One problem. `answer` is the reference solution; `gold` is the final answer a grader compares with."""

    question: str
    answer: str
    # Excluded from hashing so a Row stays hashable although a dict is not.
    extra: dict = field(default_factory=dict, hash=False)

    @property
    def gold(self) -> str:
        """The text after the last `####` (the whole answer when there is none), stripped, commas removed."""
        _, marker, tail = self.answer.rpartition("####")
        return (tail if marker else self.answer).strip().replace(",", "")
