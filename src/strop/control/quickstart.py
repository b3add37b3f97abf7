"""`strop quickstart`: the GSM8K story end to end, on the control plane, so every part stays inspectable.

    manifest = quickstart.run_quickstart(QuickstartOptions(out="quickstart-out"))
    quickstart_cleanup.cleanup("quickstart-out")    # removes what that quickstart made, and nothing else

Steps: select the base model; register the train and eval data as datasets of a project of its own;
evaluate the baseline (an `openai:NAME@URL` endpoint, else the untuned base model); fine-tune with GRPO + LoRA
as a background run; evaluate the tuned model on the same items; judge both; compare (accuracy, paired
bootstrap interval, exact McNemar, judge means, win/tie/loss); write the result tables and the report.
`quickstart.json` in the output folder lists everything made (store records, and each file and folder
written under --out), for `strop cleanup`; a user's own files in --out are never touched.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from strop.control.progress import EvalBar, RunBar
from strop.control.reports import save_tables, write_report
from strop.data import load_rows
from strop.data.gsm8k import GSM8KUnavailable
from strop.engine.precision import cuda_count
from strop.errors import StropError
from strop.rl.config import GRPOConfig
from strop.rl.limits import LIMITS

MANIFEST = "quickstart.json"


TASKS = ("gsm8k", "finance-sql")


@dataclass(frozen=True)
class QuickstartOptions:
    task: str = "gsm8k"                 # gsm8k (math word problems) | finance-sql (tool use)
    base_model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    dataset: str = "synthetic"          # synthetic | synthetic:LEVEL | gsm8k
    data_file: str | None = None        # a local GSM8K-style file, or a folder with train.jsonl and test.jsonl
    steps: int = 16
    eval_n: int = 100
    baseline: str | None = None         # openai:NAME@URL; None: the untuned base model
    judge: str | None = "local"         # openai:NAME@URL | local (the untuned base model) | a model id | None
    out: str = "quickstart-out"
    results_url: str | None = None
    group_size: int = 8
    batch_size: int = 8
    max_tokens: int = 48
    learning_rate: float = 1e-4
    lora_rank: int = 32
    seed: int = 0
    concurrency: int = 4                # for openai:NAME@URL baselines and judges
    max_retries: int = 3
    request_timeout: float = 120.0
    demos: int = 240                    # finance-sql: demonstrations for the warm start
    sft_steps: int = 24                 # finance-sql: supervised steps of sft_batch_size demonstrations
    sft_batch_size: int = 4
    sft_learning_rate: float = 5e-4

    @classmethod
    def for_task(cls, task: str = "gsm8k", **given) -> QuickstartOptions:
        """The options of `task`: its own defaults, then what was given (None: the default)."""
        defaults = TASK_DEFAULTS.get(task, {}) if isinstance(task, str) else {}
        return cls(task=task, **{**defaults, **{k: v for k, v in given.items() if v is not None}})


# what a task sizes differently from the dataclass's defaults (gsm8k's). finance-sql's episodes are ~1,500 tokens:
# on 2 CPU cores with bf16 units, ~27 s a supervised step of 4, 7-9 s an evaluation episode and 3-4 minutes a GRPO
# step of 4 x 4 episodes, so its defaults are sized to tell the story in under half an hour there (28 min 39 s
# measured, benchmarks/RESULTS.md), with 20 episodes a split; the evidence at scale is
# benchmarks/learning_finance_sql.py
TASK_DEFAULTS: dict[str, dict] = {
    "gsm8k": {"judge": "local"},
    "finance-sql": {"steps": 2, "batch_size": 4, "group_size": 4, "max_tokens": 160, "eval_n": 20, "judge": None,
                    "learning_rate": 5e-5},
}


# quickstart option -> the run config field it sets
TRAINING = {"steps": "max_steps", "group_size": "group_size", "batch_size": "batch_size",
            "max_tokens": "max_completion_length", "lora_rank": "lora_rank", "learning_rate": "learning_rate"}

# What quickstart writes under --out (besides quickstart.json); an existing one is never overwritten.
OWN_FILES = ("data/train.jsonl", "data/eval.jsonl", "run.json", "report/report.html", "report/dashboard.png",
             "report/training.png", "report/comparison.json", "data/demos.jsonl", "sft-run.json",
             "evaluations/baseline.json", "evaluations/warm-start.json", "evaluations/tuned.json")


def _say(message: str) -> None:
    print(f"[quickstart] {message}", file=sys.stderr, flush=True)


def judge_model(o: QuickstartOptions) -> str | None:
    """The judge the evaluations get: `local` is the quickstart's own base model, untuned."""
    return o.base_model if o.judge == "local" else o.judge


def _check(o: QuickstartOptions) -> None:
    """Every flag checked before anything is made; all the problems named at once."""
    # lazy: strop.evals.openai_client pulls in torch, numpy, which importing this module does not need
    from strop.evals.openai_client import parse_openai_ref
    problems = []
    if o.task not in TASKS:
        problems.append(f"--task must be one of {', '.join(TASKS)}, got {o.task!r}")
    elif o.task == "finance-sql":
        # lazy: the finance-sql steps load only for that task
        from strop.control import quickstart_finance
        problems += quickstart_finance.problems(o)
    # the training flags are checked by the run config's one validator (the run quickstart starts is checked by it
    # again, through its descriptor); quickstart's own options here
    for name, problem in GRPOConfig.problems_of({field: getattr(o, option) for option, field in TRAINING.items()}):
        option = next(option for option, field in TRAINING.items() if field == name)
        least, value = LIMITS[name].least, getattr(o, option)
        flag = f"--{option.replace('_', '-')}"
        problems.append(f"{flag} must be at least {least}, got {value}" if LIMITS[name].integer and value < least
                        else f"{flag} ({name}): {problem}")
    for name in ("eval_n", "concurrency"):
        if getattr(o, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
    if o.max_retries < 0:
        problems.append(f"--max-retries must be 0 or more, got {o.max_retries}")
    if not o.request_timeout > 0:
        problems.append(f"--timeout must be more than 0 seconds, got {o.request_timeout}")
    for flag, ref in (("--baseline", o.baseline), ("--judge", o.judge)):
        if ref is not None and (flag == "--baseline" or ref.startswith("openai:")):
            try:
                parse_openai_ref(ref)
            except StropError as exc:
                problems.append(f"{flag}: {exc}")
    if o.judge is not None and o.judge.startswith("model-"):
        # lazy: strop.control.models pulls in sqlalchemy, which importing this module does not need
        from strop.control import models
        try:
            models.get(o.judge)
        except StropError as exc:
            problems.append(f"--judge: {exc}")
    if o.task == "gsm8k" and o.data_file is None and not (o.dataset == "gsm8k" or o.dataset == "synthetic" or o.dataset.startswith("synthetic:")):
        problems.append(f"--dataset must be synthetic, synthetic:LEVEL or gsm8k (or give --data-file), got {o.dataset!r}")
    if o.task == "gsm8k" and o.data_file is not None and not Path(o.data_file).exists():
        problems.append(f"--data-file {o.data_file}: no such file or folder")
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        problems.append(f"--out {out} is a file; give a folder")
    elif (out / MANIFEST).exists():
        status = _read_status(out)
        problems.append(f"--out {out} holds an earlier quickstart{f' ({status})' if status else ''}: run "
                        f"`strop cleanup --out {out}` first to remove what it made, then run this again; or pick "
                        "another --out")
    else:
        taken = [name for name in OWN_FILES if (out / name).exists()]
        if taken:
            problems.append(f"--out {out} already has {', '.join(taken)}, which quickstart would overwrite; move "
                            "them or pick another --out")
    if problems:
        raise StropError("quickstart cannot start:\n  " + "\n  ".join(problems))


def _read_status(out: Path) -> str | None:
    try:
        return json.loads((out / MANIFEST).read_text()).get("status")
    except (OSError, ValueError):
        return None


def _rows(o: QuickstartOptions) -> tuple[list, list]:
    """The training rows and the evaluation rows."""
    need_train = o.steps * o.batch_size
    if o.data_file is not None:
        source = Path(o.data_file)
        if source.is_dir():
            return load_rows(str(source / "train.jsonl")), load_rows(str(source / "test.jsonl"), limit=o.eval_n)
        rows = load_rows(str(source))
        if len(rows) < o.eval_n + 1:
            raise StropError(f"--data-file {source} has {len(rows)} rows: too few for --eval-n {o.eval_n} "
                             "and training; lower --eval-n or give a folder with train.jsonl and test.jsonl")
        return rows[:-o.eval_n], rows[-o.eval_n:]
    source = "synthetic:add" if o.dataset == "synthetic" else o.dataset
    try:
        train = load_rows(source, split="train", limit=need_train if source != "gsm8k" else None, seed=o.seed)
        test = load_rows(source, split="test", limit=o.eval_n, seed=o.seed + 1)
    except GSM8KUnavailable as exc:
        # the loader's own hint names `--dataset FILE`, which `strop train` takes; quickstart takes --data-file
        raise StropError(f"--dataset gsm8k: {exc.reason}; give a local copy instead: --data-file path/to/gsm8k.jsonl "
                         "(one {\"question\": ..., \"answer\": ...} object per line; the last --eval-n rows are "
                         "held out), or --data-file FOLDER with train.jsonl and test.jsonl") from None
    return train, test


def _descriptor(o: QuickstartOptions, project: str, dataset: str) -> dict:
    return {"kind": "run", "project": project, "configName": "quickstart", "baseModel": o.base_model,
            "config": {"dataset": dataset, "method": "grpo",
                       "rlHyperparams": {"epochs": 100, "maxSteps": o.steps, "groupSize": o.group_size, "klBeta": 0.0,
                                         "temperature": 1.0, "maxCompletionLength": o.max_tokens,
                                         "batchSize": o.batch_size, "lora": {"rank": o.lora_rank},
                                         "optimizer": {"learningRate": o.learning_rate}},
                       "reward": {"terms": [{"kind": "rule", "weight": 1.0, "bundle": "builtin:gsm8k", "name": "correct"}]},
                       "maxSeqLength": 1024},
            "execution": {"gpus": min(1, cuda_count()), "saveEvery": max(1, o.steps // 2), "keepAdapters": 2}}


class _Manifest:
    """quickstart.json, rewritten after every step, so a failure part-way still leaves what to clean up."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data
        self.save()

    def set(self, **values) -> None:
        self.data.update(values)
        self.save()

    def made(self, path: Path) -> Path:
        """Record `path` (under --out) before it is written, so cleanup removes it and nothing beside it."""
        relative = path.relative_to(self.path.parent).as_posix()
        if relative not in self.data["created"]:
            self.set(created=[*self.data["created"], relative])
        return path

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def _wait_run(run_id: str, steps: int) -> dict:
    # lazy: strop.control.runs pulls in sqlalchemy, which importing this module does not need
    from strop.control import runs
    with RunBar(run_id, steps) as bar:
        return runs.wait(run_id, on_poll=bar.update, interval=2.0)


def _evaluate(model: str, dataset: str, o: QuickstartOptions, what: str, manifest: _Manifest) -> dict:
    # lazy: strop.control.evaluations pulls in sqlalchemy, which importing this module does not need
    from strop.control import evaluations
    judge = judge_model(o)
    started = evaluations.start(model, dataset, "builtin:gsm8k", max_tokens=o.max_tokens, limit=o.eval_n,
                                judge=judge, concurrency=o.concurrency, max_retries=o.max_retries,
                                request_timeout=o.request_timeout)
    # recorded before waiting: one that fails is still ours to clean up
    manifest.set(evaluations={**manifest.data["evaluations"], what: started["evaluationId"]})
    _say(f"{what}: evaluation {started['evaluationId']} of {model} on {o.eval_n} items"
         + (f", judged by {judge}" if judge else ""))
    with EvalBar(what) as bar:
        info = evaluations.wait(started["evaluationId"], interval=2.0, on_poll=bar.update)
    if info["status"] != "succeeded":
        raise StropError(f"the {what} evaluation {info['evaluationId']} of {model} {info['status']}: {info.get('error')}")
    errors = (info.get("summary") or {}).get("requestErrors") or 0
    if errors:
        _say(f"warning: {errors} of {o.eval_n} requests to {model} failed and count as wrong")
    return info


def run_quickstart(o: QuickstartOptions) -> dict:
    """Run every step; return the manifest (ids, files, figures). A failure part-way is recorded in the
    manifest (status failed, the error) and raised; `cleanup` then removes what was made."""
    # lazy: strop.control.base_models pulls in sqlalchemy, which importing this module does not need
    from strop.control import base_models
    _check(o)
    _say(f"base model {o.base_model}: selecting (the first time converts and caches its weights)")
    base_models.select(o.base_model)
    judge = judge_model(o)
    if judge and not judge.startswith(("openai:", "model-")) and judge != o.base_model:
        try:
            base_models.select(judge)
        except StropError as exc:
            raise StropError(f"--judge {judge}: {exc}") from None
    train_rows, eval_rows = _rows(o) if o.task == "gsm8k" else (None, None)
    out = Path(o.out).resolve()
    made_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    manifest = _Manifest(out / MANIFEST, {"quickstartId": f"quickstart-{uuid.uuid4().hex[:8]}", "status": "running",
                                          "options": asdict(o), "out": str(out), "createdOut": made_out,
                                          "created": [], "project": None, "datasets": [], "run": None,
                                          "model": None, "evaluations": {}, "results": None, "report": None})
    try:
        if o.task == "finance-sql":
            # lazy: the finance-sql steps load only for that task
            from strop.control import quickstart_finance
            quickstart_finance.run_steps(o, out, manifest, _say)
        else:
            _steps(o, out, manifest, train_rows, eval_rows)
    except (StropError, KeyboardInterrupt) as exc:
        manifest.set(status="failed", error=str(exc) or type(exc).__name__)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise StropError(f"{exc}\nquickstart stopped; what it made so far is listed in {manifest.path}: "
                         f"`strop cleanup --out {o.out}` removes it") from None
    manifest.set(status="succeeded")
    return manifest.data


def _steps(o: QuickstartOptions, out: Path, manifest: _Manifest, train_rows, eval_rows) -> None:
    # lazy: strop.control.projects pulls in sqlalchemy, which importing this module does not need
    from strop.control import projects, registry, runs
    from strop.control.evaluations import compare_evaluations
    from strop.evals.compare import comparison_table
    started = time.monotonic()
    name = manifest.data["quickstartId"]
    if not (out / "data").exists():
        manifest.made(out / "data").mkdir()
    files = {}
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        files[split] = manifest.made(out / "data" / f"{split}.jsonl")
        files[split].write_text("".join(json.dumps({"question": r.question, "answer": r.answer}) + "\n" for r in rows))
    projects.create(name)
    manifest.set(project=name)
    train = registry.register_dataset(f"{name}/train", files["train"])
    manifest.set(datasets=[f"{name}/train"])
    evaluation_set = registry.register_dataset(f"{name}/eval", files["eval"])
    manifest.set(datasets=[f"{name}/train", f"{name}/eval"])
    _say(f"data: {train['ref']} for training, {evaluation_set['ref']} for evaluation")

    baseline = _evaluate(o.baseline or o.base_model, evaluation_set["ref"], o, "baseline", manifest)

    descriptor_path = manifest.made(out / "run.json")
    descriptor_path.write_text(json.dumps(_descriptor(o, name, train["ref"]), indent=1))
    run = runs.start(descriptor_path)
    manifest.set(run=run["runId"])
    _say(f"training: run {run['runId']} ({o.steps} GRPO steps x {o.batch_size} prompts x {o.group_size} samples)")
    finished = _wait_run(run["runId"], o.steps)
    if finished["status"] != "succeeded":
        raise StropError(f"run {run['runId']} {finished['status']}: {finished.get('error')}")
    manifest.set(model=finished["modelId"])

    tuned = _evaluate(finished["modelId"], evaluation_set["ref"], o, "tuned", manifest)

    base_label = (o.baseline[len("openai:"):].partition("@")[0] if o.baseline
                  else o.base_model.rstrip("/").rsplit("/", 1)[-1] + " (base)")
    labels = (base_label, o.base_model.rstrip("/").rsplit("/", 1)[-1] + " (RL-tuned)")
    comparison = compare_evaluations(baseline["evaluationId"], tuned["evaluationId"], labels=labels)
    # replace, not overwrite: the tables may hold other comparisons' rows, which are not ours to drop
    manifest.set(results={"comparisonId": comparison["comparisonId"], "resultsUrl": o.results_url})
    results = save_tables(comparison, url=o.results_url, mode="replace")
    manifest.set(results={**results, "comparisonId": comparison["comparisonId"], "resultsUrl": o.results_url})
    report = out / "report"
    if not report.exists():
        manifest.made(report)
    for own in OWN_FILES:
        if own.startswith("report/"):
            manifest.made(out / own)
    report_files = write_report(report, comparison=comparison, run_id=run["runId"],
                         extra={"run": run["runId"], "model": finished["modelId"],
                                "baseline evaluation": baseline["evaluationId"],
                                "tuned evaluation": tuned["evaluationId"], "tables": results["url"]})
    manifest.set(report=report_files, seconds=round(time.monotonic() - started, 1),
                 summary={k: v for k, v in comparison.items() if k != "items"}, table=comparison_table(comparison))
