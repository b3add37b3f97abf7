"""Weighted reward terms: a completion's reward is the weighted sum of several graders' scores.

Each `RewardTerm` names a grader and its weight. `score_terms` calls every grader on one completion and returns
the raw score of each (for logging) and the weighted total (for the policy update). A grader that raises, or
returns something other than a number in the score range (finite, |score| <= 1e6: `strop.scoring.score_range`),
scores 0.0 for that completion and the problem is listed in `errors`: one broken grader must not stop a training
run, but it must not be silent either.

    >>> from strop.scoring import terms_from_spec, score_terms
    >>> terms = terms_from_spec([
    ...     {"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"},
    ...     {"name": "format", "weight": 0.1, "grader": "builtin:gsm8k-format"},
    ... ])
    >>> score_terms(terms, "3 + 4 = 7\\n#### 7", row)        # row: anything with question, answer, extra
    TermScores(scores={'correct': 1.0, 'format': 1.0}, total=1.1, errors=[])
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from strop.data.row import grader_context
from strop.errors import StropError
from strop.scoring.bundles import DEFAULT_FUNCTION, DEFAULT_MODULE, load_grader, split_ref
from strop.scoring.score_range import SCORE_RANGE, score_problem

SPEC_KEYS = ("name", "weight", "grader", "judge")
JUDGE_KEYS = ("rubric", "judge", "timeout", "mode")


@dataclass(frozen=True)
class RewardTerm:
    """One grader and its weight in the total reward; `ref` is the grader reference it came from, if any."""

    name: str
    weight: float
    fn: Callable[..., Any]
    ref: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise StropError(f"reward term name must be a non-empty string, got {self.name!r}.")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) or not math.isfinite(self.weight):
            raise StropError(f"reward term {self.name!r}: weight must be a finite number, got {self.weight!r}.")
        if not callable(self.fn):
            raise StropError(f"reward term {self.name!r}: fn must be a callable grader, got {type(self.fn).__name__}.")


@dataclass(frozen=True)
class TermScores:
    """Raw score per term name, the weighted total, and what went wrong (empty when every grader behaved)."""

    scores: dict[str, float]
    total: float
    errors: list[str] = field(default_factory=list)


def score_terms(terms: list[RewardTerm], completion: str, row: Any, *, data_source: str | None = None) -> TermScores:
    """Score `completion` for `row` (anything with `question`, `answer` and `extra`) with every term."""
    own_source, extra = grader_context(row)
    data_source = data_source if data_source is not None else own_source
    ground_truth = getattr(row, "answer", None)
    scores: dict[str, float] = {}
    errors: list[str] = []
    total = 0.0
    for term in terms:
        if is_group_term(term):
            continue  # scored with the rest of its group once the group is complete: score_group_terms
        # Each grader gets its own copy, so one that mutates extra_info cannot change what the next one sees.
        info = dict(extra)
        try:
            raw = term.fn(data_source=data_source, solution_str=completion, ground_truth=ground_truth, extra_info=info)
        except Exception as e:
            errors.append(f"reward term {term.name!r}{_from(term)} raised {type(e).__name__}: {e}")
            raw = 0.0
        value, problem = _as_score(raw)
        problem = problem or score_problem(value)  # 1e39 is a float, but it made float32 rewards infinite
        if problem:
            errors.append(f"reward term {term.name!r}{_from(term)} returned {problem}; a grader must return "
                          f"{SCORE_RANGE} (scored 0.0)")
            value = 0.0
        scores[term.name] = value
        total += term.weight * value
    return TermScores(scores=scores, total=total, errors=errors)


def is_group_term(term: RewardTerm) -> bool:
    """A term that scores a group's completions together (a judge term in group mode), not one at a time."""
    return getattr(term.fn, "group", False) is True and callable(getattr(term.fn, "score_group", None))


def score_group_terms(terms: list[RewardTerm], question: str, ground_truth, completions: list[str]
                      ) -> tuple[list[dict[str, float]], list[str]]:
    """The group terms' scores for each of a group's completions (one dict per completion, the term's raw score
    by name) and what went wrong: a term that raised or scored out of range scores 0.0 for the whole group,
    with its reason listed once, as `score_terms` does for one completion's grader."""
    scores: list[dict[str, float]] = [{} for _ in completions]
    errors: list[str] = []
    for term in terms:
        if not is_group_term(term):
            continue
        try:
            values = [float(v) for v in term.fn.score_group(question, ground_truth, list(completions))]
            problem = next((score_problem(v) for v in values if score_problem(v)), None)
            if len(values) != len(completions) or problem:
                raise ValueError(problem or f"{len(values)} scores for {len(completions)} completions")
        except Exception as e:  # noqa: BLE001 - a judge that fails scores the group 0.0, counted like a grader
            errors.append(f"reward term {term.name!r}{_from(term)} could not score the group: "
                          f"{type(e).__name__}: {e}")
            values = [0.0] * len(completions)
        for row, value in zip(scores, values):
            row[term.name] = value
    return scores, errors


def terms_from_spec(spec: list[dict], *, sandbox=None) -> list[RewardTerm]:
    """Reward terms from dicts like `{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"}`.

    `weight` defaults to 1.0; `name` defaults to a short form of the grader reference. Names must be unique
    because scores are reported by name. With a `sandbox` (a `SandboxPool`), bundle graders are loaded and
    called in its worker processes, never imported here; built-in graders run in-process.
    """
    if not isinstance(spec, (list, tuple)) or not spec:
        raise StropError(f"reward terms must be a non-empty list of {{'grader': ..., 'weight': ...}} entries, "
                         f"got {spec!r}.")
    terms: list[RewardTerm] = []
    for i, entry in enumerate(spec, start=1):
        where = f"reward term {i}"
        if not isinstance(entry, dict):
            raise StropError(f"{where}: expected a mapping like {{'grader': 'builtin:gsm8k', 'weight': 1.0}}, "
                             f"got {entry!r}.")
        unknown = sorted(set(entry) - set(SPEC_KEYS))
        if unknown:
            raise StropError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed keys are "
                             f"{', '.join(SPEC_KEYS)}.")
        if "judge" in entry:
            terms.append(_judge_term(where, entry, [t.name for t in terms]))
            continue
        ref = entry.get("grader")
        if not isinstance(ref, str) or not ref.strip():
            raise StropError(f"{where}: 'grader' is required, e.g. 'builtin:gsm8k' or "
                             f"'./scoring#reward:compute_score'.")
        name, weight = _name_and_weight(where, entry, default_name(ref), [t.name for t in terms])
        if sandbox is not None and not ref.strip().startswith("builtin:"):
            fn = sandbox.grader(ref)
            sandbox.check(ref)
        else:
            fn = load_grader(ref)
        terms.append(RewardTerm(name=name, weight=weight, fn=fn, ref=ref))
    return terms


def _judge_term(where: str, entry: dict, taken: list[str]) -> RewardTerm:
    """A term scored by an LLM judge: `{"name", "weight", "judge": {"rubric", "judge", "timeout", "mode"}}`."""
    spec = entry["judge"]
    if not isinstance(spec, dict):
        raise StropError(f"{where}: 'judge' must be a mapping like {{'rubric': 'Is it correct?', 'judge': 'local'}}, "
                         f"got {spec!r}.")
    unknown = sorted(set(spec) - set(JUDGE_KEYS))
    if unknown:
        raise StropError(f"{where}: unknown judge key(s) {', '.join(map(repr, unknown))}; allowed keys are "
                         f"{', '.join(JUDGE_KEYS)}.")
    name, weight = _name_and_weight(where, entry, "judge", taken)
    # imported here: the judge is built on strop.evals, which imports this module to score its items
    from strop.scoring.judge_terms import JudgeGrader
    try:
        fn = JudgeGrader(spec.get("rubric"), spec.get("judge", "local"), timeout=spec.get("timeout", 30.0),
                         mode=spec.get("mode", "pointwise"))
    except StropError as exc:
        raise StropError(f"{where} ({name!r}): {exc}") from None
    return RewardTerm(name=name, weight=weight, fn=fn, ref=f"judge:{fn.judge}")


def _name_and_weight(where: str, entry: dict, default: str, taken: list[str]) -> tuple[str, float]:
    """An entry's name (unique among `taken`) and finite weight, refused clearly otherwise."""
    name = entry.get("name") or default
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
        raise StropError(f"{where} ({name!r}): weight must be a finite number, got {weight!r}.")
    if name in taken:
        raise StropError(f"{where}: name {name!r} is already used by another term; give each term a distinct "
                         f"'name' (names so far: {', '.join(taken)}).")
    return name, float(weight)


def default_name(ref: str) -> str:
    """A short readable term name for a grader reference: 'builtin:gsm8k' -> 'gsm8k', './x#rew:fmt' -> 'fmt'."""
    ref = ref.strip()
    for prefix in ("builtin:", "bundle:"):
        if ref.startswith(prefix):
            if prefix == "builtin:":
                return ref[len(prefix):]
            ref = ref[len(prefix):]
    directory, module, function = split_ref(ref)
    if function != DEFAULT_FUNCTION:
        return function
    if module != DEFAULT_MODULE:
        return module
    return Path(directory.rstrip("/\\")).name or "reward"


def _from(term: RewardTerm) -> str:
    return f" ({term.ref})" if term.ref else ""


def _as_score(raw: Any) -> tuple[float, str | None]:
    """(score, None) for a usable grader result, else (0.0, description of what came back)."""
    # verl-style graders may return {"score": x, ...} with extra diagnostics alongside.
    if isinstance(raw, dict) and "score" in raw:
        raw = raw["score"]
    if isinstance(raw, numbers.Real):  # includes bool and numpy scalars
        value = float(raw)
        return (value, None) if math.isfinite(value) else (0.0, repr(value))
    item = getattr(raw, "item", None)  # 0-d tensors and arrays
    if callable(item):
        try:
            return _as_score(item())
        except Exception:
            pass
    shown = repr(raw)
    return 0.0, ("None" if raw is None else f"{type(raw).__name__} {shown[:60]}")
