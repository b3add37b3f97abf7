"""Reward terms scored by an LLM judge on a rubric.

A judge term is a grader like any other (`strop.scoring.terms`): called per completion, it returns a score in
0..1, and when no verdict can be had (a timeout, an HTTP error, a reply that does not parse) it raises, so the
failure is counted and listed exactly as a grader's error is, and scores 0.0 for that completion. The judge is
`strop.evals.judge.Judge`: its endpoint client, its JSON-schema verdicts (a local model decodes under the grammar)
and its parsing are used as they are. Verdicts are cached by (rubric, prompt, completion), so a pair already
judged is not asked again.

    >>> grader = JudgeGrader("Is the answer correct and shown step by step?", "openai:judge@http://127.0.0.1:8000/v1")
    >>> grader(data_source=None, solution_str="3 + 4 = 7", ground_truth="7", extra_info={"question": "3+4?"})
    0.8
"""

from __future__ import annotations

import threading
import time

from strop.errors import StropError
from strop.evals.judge import Judge, JudgeError, JudgeInput, JudgeMetric
from strop.evals.openai_client import parse_openai_ref

# A pointwise verdict is {"score": 0..SCALE, "reasoning": "..."}; the term's score is score / SCALE.
SCALE = 10
JUDGE_FORMS = '"local", "local:MODEL" (a model id or directory) or "openai:NAME@URL"'


def judge_form_problem(judge: str) -> str | None:
    """What is wrong with a term's `judge` value, or None."""
    if not isinstance(judge, str) or not judge.strip():
        return f"a judge must be one of {JUDGE_FORMS}"
    if judge == "local":
        return None
    if judge.startswith("local:"):
        return None if judge[len("local:"):].strip() else f"'local:' names no model; use one of {JUDGE_FORMS}"
    if judge.startswith("openai:"):
        try:
            parse_openai_ref(judge)
        except StropError as exc:
            return str(exc)
        return None
    return f"{judge!r} is not a judge form; use one of {JUDGE_FORMS}"


class JudgeGrader:
    """A grader (verl's signature) that asks `judge` to score a completion on `rubric`; 0..1, or raises."""

    def __init__(self, rubric: str, judge: str = "local", *, timeout: float = 30.0, base_model: str | None = None,
                 max_tokens: int = 512, service=None):
        if not isinstance(rubric, str) or not rubric.strip():
            raise StropError("a judge reward term needs a rubric: a sentence saying what earns a high score")
        problem = judge_form_problem(judge)
        if problem:
            raise StropError(f"judge reward term: {problem}")
        if not timeout > 0:
            raise StropError(f"judge reward term: timeout must be a positive number of seconds, got {timeout!r}")
        self.rubric = " ".join(rubric.split())
        self.judge = judge
        local = judge[len("local:"):] if judge.startswith("local:") else (base_model if judge == "local" else None)
        model = judge if judge.startswith("openai:") else (local or "local")
        try:
            self._judge = Judge(model, [JudgeMetric("score", self.rubric, 0, SCALE)], retries=0,
                                max_tokens=max_tokens, concurrency=1, timeout=timeout, max_retries=0,
                                service=service)
        except JudgeError as exc:
            raise StropError(f"judge reward term: {exc}") from None
        self._cache: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self.calls = self.cache_hits = self.failures = 0
        self.seconds = 0.0

    def __call__(self, *, data_source=None, solution_str: str, ground_truth=None, extra_info=None) -> float:
        prompt = str((extra_info or {}).get("question") or "")
        key = (self.rubric, prompt, solution_str)
        with self._lock:
            if key in self._cache:
                self.cache_hits += 1
                return self._cache[key]
            self.calls += 1
        started = time.monotonic()
        [verdict] = self._judge.judge_many([JudgeInput(prompt, "" if ground_truth is None else str(ground_truth),
                                                       solution_str)])
        with self._lock:
            self.seconds += time.monotonic() - started
            if verdict.scores is None:
                self.failures += 1
                raise StropError(f"the judge ({self.judge}) gave no verdict: {verdict.error}")
            score = verdict.scores["score"] / SCALE
            self._cache[key] = score
        return score
