"""Evaluate a model on rows with a grader: per-item records and a summary.

    from strop.evals import evaluate_local
    result = evaluate_local("HuggingFaceTB/SmolLM2-135M-Instruct", rows, "builtin:gsm8k", max_tokens=48)
    result.summary["accuracy"], result.items[0].response

Greedy by default (temperature 0, one sample); with `samples=k > 1` it draws k samples per problem at the given
temperature and reports pass@k with the unbiased estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k) over
n = k samples with c correct, which for n == k is simply "any sample right".
An item is correct when its score reaches `correct_at` (default 1.0: the grader's full marks); graders that
add a format bonus, as the run-descriptor walkthrough's does (1.1 for a right answer), are handled by that threshold.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import strop
from strop import model_info, types
from strop.data.row import grader_context
from strop.renderers import get_renderer, get_text_content
from strop.scoring.gsm8k import extract_answer
from strop.scoring.sandbox import grader_for
from strop.scoring.score_range import score_problem
from strop.tokenizer_utils import get_tokenizer


@dataclass(frozen=True)
class EvalItem:
    index: int
    question: str
    gold: str
    response: str
    extracted: str | None
    score: float
    correct: bool
    tokens: int
    latency_s: float
    samples_correct: int = 0
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EvalResult:
    items: list[EvalItem]
    summary: dict = field(default_factory=dict)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _score(grader, response: str, row) -> tuple[float, str | None]:
    try:
        data_source, extra_info = grader_context(row)
        value = grader(data_source=data_source, solution_str=response, ground_truth=row.answer, extra_info=extra_info)
        value = float(value)
        problem = score_problem(value)  # NaN, or 1e39: one such score would swamp the evaluation's mean
        if problem:
            return 0.0, f"grader returned {problem}"
        return value, None
    except Exception as exc:  # a broken grader fails the item, not the evaluation
        return 0.0, f"{type(exc).__name__}: {exc}"


def evaluate_sampler(sampler, renderer, rows, grader_ref: str, *, max_tokens: int = 256, samples: int = 1,
                     temperature: float | None = None, system_prompt: str | None = None, correct_at: float = 1.0,
                     progress: bool = False, batch: int = 64, on_progress=None) -> EvalResult:
    """Evaluate a strop SamplingClient; requests go out in batches of `batch` problems.

    `on_progress(done, total, correct)` is called after each batch (the background worker reports with it).
    """
    with grader_for(grader_ref) as grader:  # bundle code runs sandboxed, as in training
        return _evaluate(sampler, renderer, rows, grader, max_tokens=max_tokens, samples=samples,
                         temperature=temperature, system_prompt=system_prompt, correct_at=correct_at,
                         progress=progress, batch=batch, on_progress=on_progress)


def _evaluate(sampler, renderer, rows, grader, *, max_tokens, samples, temperature, system_prompt, correct_at,
              progress, batch, on_progress) -> EvalResult:
    temperature = (0.0 if samples == 1 else 1.0) if temperature is None else temperature
    params = types.SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=0,
                                  stop=renderer.get_stop_sequences())
    bar = None
    if progress:
        # lazy: tqdm is heavy or optional, loaded only when this runs
        from tqdm import tqdm
        bar = tqdm(total=len(rows), desc="eval", unit="item", file=sys.stderr, dynamic_ncols=True)
    items: list[EvalItem] = []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        t0 = time.perf_counter()
        futures = []
        for row in chunk:
            messages = row.conversation(system_prompt)
            futures.append(sampler.sample(prompt=renderer.build_generation_prompt(messages), num_samples=samples,
                                          sampling_params=params))
        responses = [f.result() for f in futures]
        latency = (time.perf_counter() - t0) / max(1, len(chunk))  # batched: the per-item share of wall time
        for offset, (row, response) in enumerate(zip(chunk, responses)):
            scored = []
            for seq in response.sequences:
                message, _ = renderer.parse_response(seq.tokens)
                text = get_text_content(message)
                scored.append((text, *_score(grader, text, row), len(seq.tokens)))
            text, score, error, n_tokens = scored[0]
            right = sum(s >= correct_at for _, s, _, _ in scored)
            items.append(EvalItem(index=start + offset, question=row.question, gold=row.gold, response=text,
                                  extracted=extract_answer(text), score=score, correct=score >= correct_at,
                                  tokens=n_tokens, latency_s=latency, samples_correct=right, error=error))
        if bar is not None:
            bar.update(len(chunk))
            bar.set_postfix(accuracy=f"{sum(i.correct for i in items) / len(items):.1%}")
        if on_progress is not None:
            on_progress(len(items), len(rows), sum(i.correct for i in items))
    if bar is not None:
        bar.close()
    return EvalResult(items=items, summary=summarize(items, samples))


def summarize(items: list[EvalItem], samples: int = 1) -> dict:
    n = len(items)
    if n == 0:
        return {"n": 0}
    summary = {
        "n": n,
        "meanScore": statistics.fmean(i.score for i in items),
        "accuracy": sum(i.correct for i in items) / n,
        "parseFailures": sum(i.extracted is None for i in items),
        "graderErrors": sum(i.error is not None for i in items),
        "meanTokens": statistics.fmean(i.tokens for i in items),
    }
    if samples > 1:
        summary[f"pass@{samples}"] = statistics.fmean(pass_at_k(samples, i.samples_correct, samples) for i in items)
        summary["pass@1"] = statistics.fmean(pass_at_k(samples, i.samples_correct, 1) for i in items)
    return summary


def evaluate_local(model: str, rows, grader_ref: str, *, adapter: str | None = None, service=None, **kw) -> EvalResult:
    """Evaluate a base model (or a base model plus a saved adapter directory) in this process."""
    service = service or strop.ServiceClient()
    sampler = service.create_sampling_client(base_model=model, model_path=adapter)
    renderer = get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(model))
    return evaluate_sampler(sampler, renderer, rows, grader_ref, **kw)
