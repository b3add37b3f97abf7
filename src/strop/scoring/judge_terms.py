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

In `group` mode (RULER-style: relative scores within the group, as OpenPipe's RULER ranks trajectories) the judge
reads all of a group's completions to one prompt in a single call and scores each 0..10 against the others, so
what it rewards is being better than the group's other attempts, which is what a group-relative advantage uses:

    >>> group = JudgeGrader("Which answer is correct and clearest?", "local", mode="group")
    >>> group.score_group("3+4?", "7", ["3 + 4 = 7", "it is 8", "7"])
    [0.9, 0.1, 0.7]

Its verdict is one integer per completion (`response_1`, `response_2`, ...) under the same JSON grammar; a group
larger than GROUP_MAX is judged in consecutive parts of at most GROUP_MAX, each part relative within itself.
"""

from __future__ import annotations

import json
import threading
import time

from strop.errors import StropError
from strop.evals.judge import Judge, JudgeError, JudgeInput, JudgeMetric
from strop.evals.openai_client import parse_openai_ref

# A pointwise verdict is {"score": 0..SCALE, "reasoning": "..."}; the term's score is score / SCALE.
SCALE = 10
JUDGE_FORMS = '"local", "local:MODEL" (a model id or directory) or "openai:NAME@URL"'
MODES = ("pointwise", "group")
GROUP_MAX = 16           # completions one group verdict scores: a longer list outgrows a judge's attention
RESPONSE_CHARS = 4_000   # of each completion the group judge reads (a cut one says so): the call's size is bounded
VERDICT_TOKENS = 12      # a verdict's tokens per completion scored, beyond the reasoning's

GROUP_PROMPT = """You are judging {count} responses to the same task against each other.

**Task:** {question}
**Reference answer (may be empty):** {ground_truth}
**Rubric:** {rubric}

{responses}

Score every response from 0 to 10 on the rubric, relative to the others: the best gets the highest score, a
clearly worse one a clearly lower score, equally good ones the same score. Return ONLY valid JSON:
{example}"""


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
                 max_tokens: int = 512, service=None, mode: str = "pointwise"):
        if mode not in MODES:
            raise StropError(f"judge reward term: mode must be one of {', '.join(MODES)}, got {repr(mode)[:60]}")
        if not isinstance(rubric, str) or not rubric.strip():
            raise StropError("a judge reward term needs a rubric: a sentence saying what earns a high score")
        problem = judge_form_problem(judge)
        if problem:
            raise StropError(f"judge reward term: {problem}")
        if not timeout > 0:
            raise StropError(f"judge reward term: timeout must be a positive number of seconds, got {timeout!r}")
        self.rubric = " ".join(rubric.split())
        self.judge, self.mode, self.group = judge, mode, mode == "group"
        local = judge[len("local:"):] if judge.startswith("local:") else (base_model if judge == "local" else None)
        self._model = judge if judge.startswith("openai:") else (local or "local")
        self._options = dict(retries=0, max_tokens=max_tokens, concurrency=1, timeout=timeout, max_retries=0,
                             service=service)
        self._judges: dict[int, Judge] = {}  # group mode: one per number of completions a verdict scores
        if not self.group:
            self._judge = self._make([JudgeMetric("score", self.rubric, 0, SCALE)])
        self._cache: dict[tuple, object] = {}
        self._lock = threading.Lock()
        self.calls = self.cache_hits = self.failures = 0
        self.seconds = 0.0

    def _make(self, metrics: list[JudgeMetric], **extra) -> Judge:
        try:
            return Judge(self._model, metrics, **{**self._options, **extra})
        except JudgeError as exc:
            raise StropError(f"judge reward term: {exc}") from None

    def stats(self) -> dict:
        """What the judge cost so far: calls made, verdicts taken from the cache, calls that gave none, seconds."""
        with self._lock:
            return {"calls": self.calls, "cacheHits": self.cache_hits, "failures": self.failures,
                    "seconds": self.seconds}

    def score_group(self, question: str, ground_truth, completions: list[str]) -> list[float]:
        """Group mode: each completion's score 0..1 relative to the others, in one call per GROUP_MAX of them;
        StropError when a part gets no verdict (the caller counts it as the group's graders failing)."""
        if not self.group:
            raise StropError("score_group is the group mode's; this judge term scores each completion alone")
        gold = "" if ground_truth is None else str(ground_truth)
        scores: list[float] = []
        for start in range(0, len(completions), GROUP_MAX):
            scores += self._score_part(str(question or ""), gold, list(completions[start:start + GROUP_MAX]))
        return scores

    def _score_part(self, question: str, gold: str, part: list[str]) -> list[float]:
        key = (self.rubric, question, gold, tuple(part))
        with self._lock:
            if key in self._cache:
                self.cache_hits += 1
                return list(self._cache[key])
            self.calls += 1
            n = len(part)
            if n not in self._judges:
                metrics = [JudgeMetric(f"response_{k}", f"response {k} against the others", 0, SCALE)
                           for k in range(1, n + 1)]
                tokens = self._options["max_tokens"] + VERDICT_TOKENS * n
                self._judges[n] = self._make(metrics, max_tokens=tokens, prompt=self._group_prompt)
            judge = self._judges[n]
        started = time.monotonic()
        [verdict] = judge.judge_many([JudgeInput(question, gold, _responses(part))])
        with self._lock:
            self.seconds += time.monotonic() - started
            if verdict.scores is None:
                self.failures += 1
                raise StropError(f"the group judge ({self.judge}) gave no verdict: {verdict.error}")
            scores = [verdict.scores[f"response_{k}"] / SCALE for k in range(1, len(part) + 1)]
            self._cache[key] = tuple(scores)
        return scores

    def _group_prompt(self, metrics: list[JudgeMetric], item: JudgeInput) -> str:
        example = json.dumps({m.name: 0 for m in metrics} | {"reasoning": "<one sentence>"}).replace("0", "<int>")
        return GROUP_PROMPT.format(count=len(metrics), question=_cut(item.question), ground_truth=_cut(item.ground_truth),
                                   rubric=self.rubric, responses=item.response, example=example)

    def __call__(self, *, data_source=None, solution_str: str, ground_truth=None, extra_info=None) -> float:
        if self.group:
            raise StropError("a group judge term scores a group's completions together (score_group), not one")
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


def _responses(part: list[str]) -> str:
    """The completions as the group judge reads them: numbered, each at most RESPONSE_CHARS (a cut one says so)."""
    shown = []
    for k, text in enumerate(part, 1):
        text = text if isinstance(text, str) else str(text)
        shown.append(f"### Response {k}\n{_cut(text)}")
    return "\n\n".join(shown)


def _cut(text: str) -> str:
    """A text the group judge reads: whole, or its first RESPONSE_CHARS and a line saying how much was cut."""
    if len(text) <= RESPONSE_CHARS:
        return text
    return f"{text[:RESPONSE_CHARS]}\n[cut: {len(text):,} characters, the first {RESPONSE_CHARS:,} shown]"
