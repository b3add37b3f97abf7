"""LLM-as-judge: a model scores each response on a rubric, as JSON held to a schema.

    judge = Judge("openai:mistral-large@http://127.0.0.1:8000/v1")          # or Judge("local") / a model id
    verdicts = judge.judge_many([JudgeInput(question, gold, response), ...])
    verdicts[0].scores  # {"answer_correctness": 5, "reasoning_quality": 4}; None when no verdict could be had

The default rubric is the GSM8K walkthrough's: answer_correctness 0-5 and reasoning_quality 0-5, plus a one-sentence
`reasoning`. Custom metrics (a name, what to assess, a score range) come from an evaluation config file.

The verdict is JSON enforced by schema: an endpoint gets `response_format` json_schema (an endpoint that
refuses it is asked again without, and its text parsed); a local model decodes under the schema's grammar
(xgrammar), so it cannot write anything else. A verdict that still fails to parse or is out of range is asked
for again (`retries`); one that never comes is recorded as a failure with its reason, counted, and never
scored as 0.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import strop
from strop import model_info, types
from strop.errors import StropError
from strop.evals.openai_client import client_for, parse_openai_ref
from strop.evals.stats import cohens_kappa
from strop.models.catalog import DEFAULT_MODEL
from strop.renderers import get_renderer, get_text_content
from strop.tokenizer_utils import get_tokenizer


@dataclass(frozen=True)
class JudgeMetric:
    name: str
    prompt: str  # what to assess, in a sentence or a paragraph
    low: int = 0
    high: int = 5


BUILTIN_METRICS = {
    "answer_correctness": JudgeMetric(
        "answer_correctness", "Does the final numerical answer match ground truth? 5=exact match, 3=close, 0=wrong"),
    "reasoning_quality": JudgeMetric(
        "reasoning_quality", "Is the step-by-step reasoning clear, correct, complete? 5=excellent, 0=absent"),
    "logical_consistency": JudgeMetric(
        "logical_consistency", "Does each step follow from the ones before, and the final answer from the work "
                               "shown? 5=fully consistent, 0=contradictory or absent"),
}
DEFAULT_METRICS = ("answer_correctness", "reasoning_quality")

PROMPT = """You are an expert math evaluator. Score the model response.

**Question:** {question}
**Ground Truth Answer:** {ground_truth}
**Model Response:** {response}

Score on {count} dimensions:
{dimensions}

Return ONLY valid JSON:
{example}"""


class JudgeError(StropError):
    """The judge could not be set up (a bad metric, an unknown model)."""


@dataclass(frozen=True)
class JudgeInput:
    question: str
    ground_truth: str
    response: str


@dataclass
class Verdict:
    scores: dict[str, int] | None = None
    reasoning: str | None = None
    error: str | None = None
    attempts: int = 0

    def to_dict(self) -> dict:
        if self.scores is None:
            return {"error": self.error, "attempts": self.attempts}
        return {"scores": self.scores, "reasoning": self.reasoning, "attempts": self.attempts}

    @property
    def combined(self) -> int | None:
        return None if self.scores is None else sum(self.scores.values())


def metrics_from(specs) -> list[JudgeMetric]:
    """Metrics from names and/or config entries ({name, type: builtin|custom, prompt, score_range})."""
    metrics = []
    for spec in specs or DEFAULT_METRICS:
        if isinstance(spec, JudgeMetric):
            metrics.append(spec)
            continue
        if isinstance(spec, str):
            spec = {"name": spec, "type": "builtin"}
        name, kind = spec.get("name"), spec.get("type", "custom" if "prompt" in spec else "builtin")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name or ""):
            raise JudgeError(f"judge metric name {name!r}: use letters, digits and underscores, e.g. math_reasoning")
        if kind == "builtin":
            if name not in BUILTIN_METRICS:
                raise JudgeError(f"judge metric {name!r} is not built in (built in: {', '.join(BUILTIN_METRICS)}); "
                                 "a custom metric needs type: custom, a prompt and a score_range")
            metrics.append(BUILTIN_METRICS[name])
        elif kind == "custom":
            prompt, span = spec.get("prompt"), spec.get("score_range", [0, 5])
            if not isinstance(prompt, str) or not prompt.strip():
                raise JudgeError(f"custom judge metric {name!r} needs a prompt saying what to assess")
            if not (isinstance(span, (list, tuple)) and len(span) == 2 and all(isinstance(v, int) for v in span)
                    and span[0] < span[1]):
                raise JudgeError(f"judge metric {name!r}: score_range must be two integers [low, high] with low < high, "
                                 f"got {span!r}")
            metrics.append(JudgeMetric(name, " ".join(prompt.split()), span[0], span[1]))
        else:
            raise JudgeError(f"judge metric {name!r}: type must be builtin or custom, got {kind!r}")
    names = [m.name for m in metrics]
    if len(set(names)) != len(names) or "reasoning" in names:
        raise JudgeError(f"judge metric names must be distinct and not 'reasoning': {names}")
    return metrics


# Local decoding bounds the reasoning sentence (plain characters, no escapes) so a verdict always ends in time,
# and makes it start with a visible character, so a grammar-held model cannot give an empty or blank one.
REASONING_MAX = 240
REASONING_PATTERN = r'[^"\\\x00-\x20][^"\\\x00-\x1f]{0,239}'


def verdict_schema(metrics: list[JudgeMetric], *, bounded: bool = False) -> dict:
    properties = {m.name: {"type": "integer", "minimum": m.low, "maximum": m.high} for m in metrics}
    properties["reasoning"] = ({"type": "string", "pattern": REASONING_PATTERN} if bounded
                               else {"type": "string", "minLength": 1, "maxLength": REASONING_MAX})
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def judge_prompt(metrics: list[JudgeMetric], item: JudgeInput) -> str:
    dimensions = "\n".join(f"{i}. **{m.name}** ({m.low}-{m.high}): {m.prompt}" for i, m in enumerate(metrics, 1))
    example = json.dumps({m.name: 0 for m in metrics} | {"reasoning": "<one sentence>"}).replace("0", "<int>")
    return PROMPT.format(question=item.question, ground_truth=item.ground_truth, response=item.response,
                         count=len(metrics), dimensions=dimensions, example=example)


# A verdict is a few scores and a sentence; a reply far longer is not one, and is refused before it is parsed.
MAX_VERDICT_CHARS = 65_536


def parse_verdict(text: str, metrics: list[JudgeMetric]) -> tuple[dict[str, int], str]:
    """Scores and reasoning from a judge's reply; ValueError saying what was wrong otherwise. Bounded time on any
    reply: it is stripped and refused past MAX_VERDICT_CHARS, and JSON nested too deeply is a ValueError too."""
    text = (text or "").strip()
    if len(text) > MAX_VERDICT_CHARS:
        raise ValueError(f"the reply is {len(text):,} characters, over the {MAX_VERDICT_CHARS:,} a verdict may have "
                         f"(a few scores and one sentence): {text[:120]!r}...")
    try:
        data = _json_object(text)
    except json.JSONDecodeError:
        # a verdict wrapped in prose or a code fence: from the first '{' to the last '}'
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            raise ValueError(f"no JSON object in the reply: {text[:120]!r}") from None
        found = text[start:end + 1]
        try:
            data = _json_object(found)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the reply's JSON does not parse ({exc.msg}): {found[:120]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the verdict is not a JSON object: {text[:120]!r}")
    scores = {}
    for m in metrics:
        value = data.get(m.name)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{m.name} is missing or not an integer: {value!r}")
        if not m.low <= value <= m.high:
            raise ValueError(f"{m.name} = {value} is outside {m.low}-{m.high}")
        scores[m.name] = value
    reasoning = data.get("reasoning")
    if not isinstance(reasoning, str) or not reasoning.strip():
        raise ValueError(f"reasoning is missing or empty: {reasoning!r}; the verdict needs a one-sentence reason")
    return scores, reasoning.strip()


def _json_object(text: str):
    try:
        return json.loads(text, strict=False)
    except RecursionError:
        raise ValueError(f"the reply's JSON is nested too deeply to be a verdict: {text[:120]!r}") from None


class Judge:
    """Scores responses with `model`: 'openai:NAME@URL', 'local' (the default local model) or a local model id."""

    CHUNK = 32  # items per round of asking: one batch for a local model, `concurrency` at a time for an endpoint

    def __init__(self, model: str, metrics=None, *, retries: int = 2, max_tokens: int = 200, concurrency: int = 4,
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, max_retries: int = 3,
                 local_model: str | None = None, adapter: str | None = None, service=None, prompt=None):
        if retries < 0:
            raise JudgeError(f"judge retries must be >= 0, got {retries}")
        self.model, self.metrics, self.retries = model, metrics_from(metrics), retries
        self.max_tokens, self.concurrency = max_tokens, concurrency
        self.schema = verdict_schema(self.metrics)
        self.schema_enforced = True
        self._api_key_env, self._timeout, self._max_retries = api_key_env, timeout, max_retries
        self._local = (local_model or _default_local()) if model == "local" else model
        self._adapter = adapter
        self._service = service  # a local judge samples through it when given (a ServiceClient shared with generation)
        self._prompt = prompt or judge_prompt  # (metrics, item) -> the judge's message; a group judge words its own
        self._local_lock = threading.Lock()

    @property
    def ranges(self) -> dict[str, list[int]]:
        return {m.name: [m.low, m.high] for m in self.metrics}

    def judge_many(self, items: list[JudgeInput], *, progress: bool = False, on_progress=None) -> list[Verdict]:
        """A verdict per item. Items are asked in chunks (`CHUNK` at a time); `on_progress(settled, total)`
        is called after each, where settled counts verdicts had plus items out of retries."""
        verdicts = [Verdict() for _ in items]
        bar = None
        if progress:
            # lazy: tqdm is heavy or optional, loaded only when this runs
            from tqdm import tqdm
            bar = tqdm(total=len(items), desc="judge", unit="item", file=sys.stderr, dynamic_ncols=True)
        settled = 0
        pending = list(range(len(items)))
        for attempt in range(self.retries + 1):
            still = []
            for start in range(0, len(pending), self.CHUNK):
                chunk = pending[start:start + self.CHUNK]
                for i, reply in zip(chunk, self._ask([items[i] for i in chunk], attempt)):
                    verdict = verdicts[i]
                    verdict.attempts = attempt + 1
                    try:
                        if isinstance(reply, Exception):
                            raise ValueError(f"request failed: {type(reply).__name__}: {reply}")
                        verdict.scores, verdict.reasoning = parse_verdict(reply, self.metrics)
                        verdict.error = None
                    except ValueError as exc:
                        verdict.error = str(exc)
                        still.append(i)
                        if attempt < self.retries:
                            continue
                    settled += 1
                    if bar is not None:
                        bar.update(1)
                if on_progress is not None:
                    on_progress(settled, len(items))
            pending = still
            if not pending:
                break
        if bar is not None:
            bar.close()
        return verdicts

    # ---- backends -------------------------------------------------------------------------------------
    def _ask(self, items: list[JudgeInput], attempt: int) -> list[str | Exception]:
        if self.model.startswith("openai:"):
            return self._ask_endpoint(items, attempt)
        return self._ask_local(items, attempt)

    def _ask_endpoint(self, items, attempt):
        ref = parse_openai_ref(self.model)
        client = client_for(ref, api_key_env=self._api_key_env, timeout=self._timeout, max_retries=self._max_retries)
        response_format = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": self.schema,
                                                                   "strict": True}}

        def one(item):
            messages = [{"role": "user", "content": self._prompt(self.metrics, item)}]
            kw = dict(model=ref.model, messages=messages, max_tokens=self.max_tokens,
                      temperature=0.0 if attempt == 0 else 0.7, seed=attempt)
            try:
                if self.schema_enforced:
                    try:
                        return client.chat.completions.create(**kw, response_format=response_format).choices[0].message.content
                    except Exception as exc:  # noqa: BLE001 - an endpoint without json_schema support
                        if not _refuses_response_format(exc):
                            raise
                        self.schema_enforced = False
                return client.chat.completions.create(**kw).choices[0].message.content
            except Exception as exc:  # noqa: BLE001 - after the client's retries: this attempt failed
                return exc

        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(one, items))

    def _ask_local(self, items, attempt):
        sampler, renderer = self._local_sampler()
        # strop's decoder holds the sentence to REASONING_PATTERN; vLLM's xgrammar (0.2.8) cannot compile its
        # 240-fold repetition, and bounds it by maxLength instead (a blank sentence is then refused when parsed)
        schema = verdict_schema(self.metrics, bounded=self._engine != "vllm")
        params = types.SamplingParams(max_tokens=self.max_tokens, temperature=0.0 if attempt == 0 else 0.7,
                                      seed=attempt, json_schema=schema, stop=renderer.get_stop_sequences())
        futures = [sampler.sample(prompt=renderer.build_generation_prompt(
            [{"role": "user", "content": self._prompt(self.metrics, item)}]), num_samples=1, sampling_params=params)
            for item in items]
        replies = []
        for future in futures:
            seq = future.result().sequences[0]
            message, _ = renderer.parse_response(seq.tokens)
            replies.append(get_text_content(message))
        return replies

    def _local_sampler(self):
        with self._local_lock:  # a step's groups are judged from several threads: the model is loaded once
            if not hasattr(self, "_sampler"):
                service = self._service or strop.ServiceClient()
                sampler = service.create_sampling_client(base_model=self._local, model_path=self._adapter)
                self._engine = service.backend.sampler_facts().get("sampler")  # "strop" or "vllm"
                self._renderer = get_renderer(model_info.get_recommended_renderer_name(self._local),
                                              get_tokenizer(self._local))
                self._sampler = sampler
        return self._sampler, self._renderer


def _default_local() -> str:
    return DEFAULT_MODEL


def _refuses_response_format(exc: Exception) -> bool:
    status = getattr(exc, "status_code", None)
    return status in (400, 422) and "response_format" in str(exc)


def judge_correct(scores: dict[str, int] | None, metric: JudgeMetric) -> bool | None:
    """The judge's yes/no on correctness: the score in the top fifth of its range (4 or 5 of 0-5)."""
    if scores is None or metric.name not in scores:
        return None
    return scores[metric.name] >= metric.low + 0.8 * (metric.high - metric.low)


def summarize_verdicts(verdicts: list[Verdict], metrics: list[JudgeMetric], exact: list[bool] | None = None) -> dict:
    """Means per metric and combined, failures, and Cohen's kappa of the judge against exact grading."""
    scored = [v for v in verdicts if v.scores is not None]
    summary: dict = {"metrics": [m.name for m in metrics], "ranges": {m.name: [m.low, m.high] for m in metrics},
                     "judged": len(scored), "failures": len(verdicts) - len(scored),
                     "failureReasons": sorted({v.error for v in verdicts if v.scores is None and v.error})[:5]}
    if scored:
        summary["means"] = {m.name: sum(v.scores[m.name] for v in scored) / len(scored) for m in metrics}
        summary["means"]["combined"] = sum(v.combined for v in scored) / len(scored)
    correctness = next((m for m in metrics if m.name == "answer_correctness"), None)
    if exact is not None and correctness is not None:
        pairs = [(judge_correct(v.scores, correctness), e) for v, e in zip(verdicts, exact) if v.scores is not None]
        kappa = cohens_kappa([p for p, _ in pairs], [e for _, e in pairs]) if pairs else None
        summary["kappa"] = None if kappa is None or kappa != kappa else kappa  # NaN: one rater never varied
    return summary
