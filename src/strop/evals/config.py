"""Evaluation config files (YAML): what to evaluate on, how to grade, and which judge metrics to ask for.

    config = load_eval_config("eval.yaml")
    evaluations.start(model=..., **config.start_kwargs())

The file follows the GSM8K walkthrough's evaluation config, so that file works as written (its `agent` names the model,
its `dataset.table` the registered dataset):

    version: "1.0"
    model: model-2d69fb15                  # or agent: {name: ...}; --model on the command line wins
    dataset:
      name: gsm8k/eval                     # a registered dataset (the walkthrough calls it `table`)
      input_column: question               # the columns holding the question and the ground truth
      ground_truth_column: answer
    grader: builtin:gsm8k                  # default builtin:gsm8k
    maxTokens: 256
    limit: 50                              # the first N items only
    judge:
      model: openai:mistral-large@https://example.com/v1   # or `local`, or a model id
      retries: 2
    metrics:
      - name: answer_correctness
        type: builtin
      - name: math_reasoning
        type: custom
        prompt: |
          Evaluate the mathematical reasoning. Score 1-5 where 5 is flawless reasoning.
        score_range: [1, 5]

Metrics without a judge model use the default local judge. Every mistake is reported at once, with its key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from strop.errors import StropError
from strop.evals.judge import JudgeError, metrics_from

TOP_KEYS = {"version", "model", "agent", "dataset", "grader", "maxTokens", "samples", "limit", "judge", "metrics"}


class EvalConfigError(StropError):
    """An evaluation config file that cannot be used as written."""


@dataclass(frozen=True)
class EvalConfig:
    model: str | None = None
    dataset: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    grader: str = "builtin:gsm8k"
    max_tokens: int = 256
    samples: int = 1
    limit: int | None = None
    judge: str | None = None
    judge_retries: int = 2
    metrics: list = field(default_factory=list)

    def start_kwargs(self) -> dict:
        """Keyword arguments for `strop.control.evaluations.start` (all but the model)."""
        return {"dataset": self.dataset, "grader": self.grader, "max_tokens": self.max_tokens, "samples": self.samples,
                "limit": self.limit, "fields": self.fields or None, "judge": self.judge,
                "judge_metrics": self.metrics or None, "judge_retries": self.judge_retries}


def load_eval_config(path: str | Path) -> EvalConfig:
    # lazy: yaml is heavy or optional, loaded only when this runs
    import yaml
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvalConfigError(f"--config {path}: no such file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise EvalConfigError(f"--config {path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise EvalConfigError(f"--config {path}: the file must be a YAML mapping (dataset:, metrics:, ...)")
    problems: list[str] = []
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        problems.append(f"unknown keys {unknown}; the keys are {sorted(TOP_KEYS)}")

    model = data.get("model")
    if model is None and isinstance(data.get("agent"), dict):
        model = data["agent"].get("name")
    if model is not None and not isinstance(model, str):
        problems.append(f"model: a model id, modelId or openai:NAME@URL, got {model!r}")

    dataset, fields = _dataset(data.get("dataset"), problems)
    grader = data.get("grader", "builtin:gsm8k")
    if not isinstance(grader, str):
        problems.append(f"grader: bundle:NAME#MODULE:FUNCTION or builtin:gsm8k, got {grader!r}")
    numbers = {key: data.get(key, default) for key, default in (("maxTokens", 256), ("samples", 1), ("limit", None))}
    for key, value in numbers.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"{key}: a whole number >= 1, got {value!r}")

    judge, retries = _judge(data.get("judge"), problems)
    metrics = data.get("metrics") or []
    if not isinstance(metrics, list):
        problems.append("metrics: a list of {name, type: builtin|custom, prompt, score_range}")
        metrics = []
    else:
        try:
            metrics_from([m for m in metrics if isinstance(m, (str, dict))] or None)
        except JudgeError as exc:
            problems.append(f"metrics: {exc}")
        if any(not isinstance(m, (str, dict)) for m in metrics):
            problems.append("metrics: each entry is a name or a mapping {name, type, prompt, score_range}")
    if metrics and judge is None:
        judge = "local"
    if problems:
        raise EvalConfigError(f"--config {path}:\n  - " + "\n  - ".join(problems))
    return EvalConfig(model=model, dataset=dataset, fields=fields, grader=grader, max_tokens=numbers["maxTokens"],
                      samples=numbers["samples"], limit=numbers["limit"], judge=judge, judge_retries=retries,
                      metrics=metrics)


def _dataset(spec, problems: list[str]) -> tuple[str | None, dict[str, str]]:
    if spec is None or isinstance(spec, str):
        return spec, {}
    if not isinstance(spec, dict):
        problems.append(f"dataset: a registered dataset name or a mapping with name:, got {spec!r}")
        return None, {}
    name = spec.get("name", spec.get("table"))
    if not isinstance(name, str):
        problems.append("dataset: name (or table) must be a registered dataset, e.g. gsm8k/eval")
    fields = {}
    for key, target in (("input_column", "question"), ("ground_truth_column", "answer")):
        column = spec.get(key)
        if column is not None:
            if not isinstance(column, str):
                problems.append(f"dataset.{key}: a column name, got {column!r}")
            elif column.lower() != target:
                fields[target] = column
    extra = sorted(set(spec) - {"name", "table", "input_column", "ground_truth_column"})
    if extra:
        problems.append(f"dataset: unknown keys {extra}")
    return name if isinstance(name, str) else None, fields


def _judge(spec, problems: list[str]) -> tuple[str | None, int]:
    if spec is None:
        return None, 2
    if isinstance(spec, str):
        return spec, 2
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str):
        problems.append("judge: a model (openai:NAME@URL, local, or a model id) or a mapping {model:, retries:}")
        return None, 2
    retries = spec.get("retries", 2)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        problems.append(f"judge.retries: a whole number >= 0, got {retries!r}")
        retries = 2
    extra = sorted(set(spec) - {"model", "retries"})
    if extra:
        problems.append(f"judge: unknown keys {extra}")
    return spec["model"], retries
