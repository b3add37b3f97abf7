"""One problem of a dataset, as every loader (files, GSM8K, the synthetic generator) gives it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    """One problem. `answer` is the reference solution; `gold` is the final answer a grader compares with.
    `messages` is the row's own conversation where it brings one (verl's `prompt`: a system message, say, then the
    question as the last user turn); empty, the question is asked alone."""

    question: str
    answer: str
    # Excluded from hashing so a Row stays hashable although a dict is not.
    extra: dict = field(default_factory=dict, hash=False)
    messages: tuple = field(default=(), hash=False)

    @property
    def gold(self) -> str:
        """The text after the last `####` (the whole answer when there is none), stripped, commas removed."""
        _, marker, tail = self.answer.rpartition("####")
        return (tail if marker else self.answer).strip().replace(",", "")

    def conversation(self, system_prompt: str | None = None, question_suffix: str = "") -> list[dict]:
        """The messages a model is asked: the row's own, or its question alone; a run's system prompt goes first
        (in place of a system message of the row's own), and `question_suffix` after the last user turn."""
        messages = [dict(m) for m in self.messages] or [{"role": "user", "content": self.question}]
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}] + [m for m in messages if m["role"] != "system"]
        if question_suffix:
            last = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last]["content"] += question_suffix
        return messages


def grader_context(row) -> tuple[str | None, dict]:
    """(data_source, extra_info) a grader is called with for `row` (anything with `question` and `extra`), as verl
    calls its reward functions: the row's `data_source` field, and its other fields with the question, where a
    nested `extra_info` object (verl's rows have one) is also merged in at the top."""
    extra = dict(getattr(row, "extra", None) or {})
    source = extra.get("data_source")
    nested = extra.get("extra_info")
    info = {**extra, **(nested if isinstance(nested, dict) else {}), "question": getattr(row, "question", None)}
    return (source if isinstance(source, str) else None), info
