"""`strop quickstart`: seed 000's story end to end, on the control plane, so every part stays inspectable.

    manifest = quickstart.run_quickstart(QuickstartOptions(out="quickstart-out"))
    quickstart.cleanup("quickstart-out")            # removes what that quickstart made, and nothing else

Steps: select the base model; register the train and eval data as datasets of a project of its own;
evaluate the baseline (an `openai:NAME@URL` endpoint, else the untuned base model); fine-tune with GRPO + LoRA
as a background run; evaluate the tuned model on the same items; judge both; compare (accuracy, paired
bootstrap interval, exact McNemar, judge means, win/tie/loss); write the result tables and the report.
`quickstart.json` in the output folder lists everything made, for `strop cleanup`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from strop.errors import StropError

MANIFEST = "quickstart.json"


@dataclass(frozen=True)
class QuickstartOptions:
    base_model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    dataset: str = "synthetic"          # synthetic | synthetic:LEVEL | gsm8k
    data_file: str | None = None        # a local GSM8K-style file, or a folder with train.jsonl and test.jsonl
    steps: int = 16
    eval_n: int = 100
    baseline: str | None = None         # openai:NAME@URL; None: the untuned base model
    judge: str | None = "local"         # openai:NAME@URL | local | a model id | None (no judge)
    out: str = "quickstart-out"
    results_url: str | None = None
    group_size: int = 8
    batch_size: int = 8
    max_tokens: int = 48
    learning_rate: float = 1e-4
    lora_rank: int = 32
    seed: int = 0


def _say(message: str) -> None:
    print(f"[quickstart] {message}", file=sys.stderr, flush=True)


def _check(o: QuickstartOptions) -> None:
    problems = []
    for name in ("steps", "eval_n", "group_size", "batch_size", "max_tokens", "lora_rank"):
        if getattr(o, name) < (2 if name == "group_size" else 1):
            problems.append(f"--{name.replace('_', '-')} must be at least {2 if name == 'group_size' else 1}, "
                            f"got {getattr(o, name)}")
    if not 0 < o.learning_rate < 1:
        problems.append(f"--learning-rate must be between 0 and 1, got {o.learning_rate}")
    if o.baseline is not None:
        from strop.evals.openai_client import parse_openai_ref
        try:
            parse_openai_ref(o.baseline)
        except StropError as exc:
            problems.append(f"--baseline: {exc}")
    if o.data_file is None and not (o.dataset == "gsm8k" or o.dataset == "synthetic" or o.dataset.startswith("synthetic:")):
        problems.append(f"--dataset must be synthetic, synthetic:LEVEL or gsm8k (or give --data-file), got {o.dataset!r}")
    if o.data_file is not None and not Path(o.data_file).exists():
        problems.append(f"--data-file {o.data_file}: no such file or folder")
    out = Path(o.out)
    if out.exists() and (out / MANIFEST).exists():
        problems.append(f"--out {out} holds an earlier quickstart; `strop cleanup --out {out}` removes it, or pick "
                        "another --out")
    if problems:
        raise StropError("quickstart cannot start:\n  " + "\n  ".join(problems))


def _data(o: QuickstartOptions, folder: Path) -> tuple[Path, Path]:
    """The training rows and the evaluation rows, as two JSONL files in `folder`."""
    from strop.data import load_rows
    need_train = o.steps * o.batch_size
    if o.data_file is not None:
        source = Path(o.data_file)
        if source.is_dir():
            train, test = load_rows(str(source / "train.jsonl")), load_rows(str(source / "test.jsonl"), limit=o.eval_n)
        else:
            rows = load_rows(str(source))
            if len(rows) < o.eval_n + 1:
                raise StropError(f"--data-file {source} has {len(rows)} rows: too few for --eval-n {o.eval_n} "
                                 "and training; lower --eval-n or give a folder with train.jsonl and test.jsonl")
            train, test = rows[:-o.eval_n], rows[-o.eval_n:]
    else:
        source = "synthetic:add" if o.dataset == "synthetic" else o.dataset
        train = load_rows(source, split="train", limit=need_train if source != "gsm8k" else None, seed=o.seed)
        test = load_rows(source, split="test", limit=o.eval_n, seed=o.seed + 1)
    paths = []
    for name, rows in (("train", train), ("eval", test)):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"question": r.question, "answer": r.answer}) + "\n" for r in rows))
        paths.append(path)
    return paths[0], paths[1]


def _descriptor(o: QuickstartOptions, project: str, dataset: str) -> dict:
    return {"kind": "run", "project": project, "configName": "quickstart", "baseModel": o.base_model,
            "config": {"dataset": dataset, "method": "grpo",
                       "rlHyperparams": {"epochs": 100, "maxSteps": o.steps, "groupSize": o.group_size, "klBeta": 0.0,
                                         "temperature": 1.0, "maxCompletionLength": o.max_tokens,
                                         "batchSize": o.batch_size, "lora": {"rank": o.lora_rank},
                                         "optimizer": {"learningRate": o.learning_rate}},
                       "reward": {"terms": [{"kind": "rule", "weight": 1.0, "bundle": "builtin:gsm8k", "name": "correct"}]},
                       "maxSeqLength": 1024},
            "execution": {"gpus": 0, "saveEvery": max(1, o.steps // 2), "keepAdapters": 2}}


class _Manifest:
    """quickstart.json, rewritten after every step, so a failure part-way still leaves what to clean up."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data
        self.save()

    def set(self, **values) -> None:
        self.data.update(values)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def _wait_run(run_id: str, steps: int) -> dict:
    from strop.control import runs
    from strop.control.progress import RunBar
    with RunBar(run_id, steps) as bar:
        return runs.wait(run_id, on_poll=bar.update, interval=2.0)


def _evaluate(model: str, dataset: str, o: QuickstartOptions, what: str) -> dict:
    from strop.control import evaluations
    started = evaluations.start(model, dataset, "builtin:gsm8k", max_tokens=o.max_tokens, limit=o.eval_n,
                                judge=o.judge)
    _say(f"{what}: evaluation {started['evaluationId']} of {model} on {o.eval_n} items"
         + (f", judged by {o.judge}" if o.judge else ""))
    from strop.control.progress import EvalBar
    with EvalBar(what) as bar:
        info = evaluations.wait(started["evaluationId"], interval=2.0, on_poll=bar.update)
    if info["status"] != "succeeded":
        raise StropError(f"{what} evaluation {info['evaluationId']} {info['status']}: {info.get('error')}")
    return info


def run_quickstart(o: QuickstartOptions) -> dict:
    """Run every step; return the manifest (ids, files, figures)."""
    from strop.control import base_models, projects, registry, runs
    from strop.control.reports import write_report
    from strop.evals.compare import compare_evaluations, comparison_table
    _check(o)
    out = Path(o.out).resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    name = f"quickstart-{tag}"
    started = time.monotonic()
    manifest = _Manifest(out / MANIFEST, {"quickstartId": name, "options": asdict(o), "out": str(out),
                                          "project": None, "datasets": [], "run": None, "model": None,
                                          "evaluations": {}, "results": None, "report": None})
    _say(f"base model {o.base_model}: selecting (the first time converts and caches its weights)")
    base_models.select(o.base_model)
    if o.judge and not o.judge.startswith(("openai:", "model-")):
        from strop.models.catalog import DEFAULT_MODEL
        base_models.select(DEFAULT_MODEL if o.judge == "local" else o.judge)
    train_file, eval_file = _data(o, out / "data")
    projects.create(name)
    manifest.set(project=name)
    train = registry.register_dataset(f"{name}/train", train_file)
    manifest.set(datasets=[f"{name}/train"])
    evaluation_set = registry.register_dataset(f"{name}/eval", eval_file)
    manifest.set(datasets=[f"{name}/train", f"{name}/eval"])
    _say(f"data: {train['ref']} for training, {evaluation_set['ref']} for evaluation")

    baseline = _evaluate(o.baseline or o.base_model, evaluation_set["ref"], o, "baseline")
    manifest.set(evaluations={"baseline": baseline["evaluationId"]})

    descriptor_path = out / "run.json"
    descriptor_path.write_text(json.dumps(_descriptor(o, name, train["ref"]), indent=1))
    run = runs.start(descriptor_path)
    manifest.set(run=run["runId"])
    _say(f"training: run {run['runId']} ({o.steps} GRPO steps x {o.batch_size} prompts x {o.group_size} samples)")
    finished = _wait_run(run["runId"], o.steps)
    if finished["status"] != "succeeded":
        raise StropError(f"run {run['runId']} {finished['status']}: {finished.get('error')}")
    manifest.set(model=finished["modelId"])

    tuned = _evaluate(finished["modelId"], evaluation_set["ref"], o, "tuned")
    manifest.set(evaluations={"baseline": baseline["evaluationId"], "tuned": tuned["evaluationId"]})

    base_label = (o.baseline[len("openai:"):].partition("@")[0] if o.baseline
                  else o.base_model.rstrip("/").rsplit("/", 1)[-1] + " (base)")
    labels = (base_label, o.base_model.rstrip("/").rsplit("/", 1)[-1] + " (RL-tuned)")
    comparison = compare_evaluations(baseline["evaluationId"], tuned["evaluationId"], labels=labels)
    from strop.control.reports import save_tables
    results = save_tables(comparison, url=o.results_url, mode="overwrite")
    manifest.set(results={**results, "comparisonId": comparison["comparisonId"], "resultsUrl": o.results_url})
    files = write_report(out / "report", comparison=comparison, run_id=run["runId"],
                         extra={"run": run["runId"], "model": finished["modelId"],
                                "baseline evaluation": baseline["evaluationId"],
                                "tuned evaluation": tuned["evaluationId"], "tables": results["url"]})
    manifest.set(report=files, seconds=round(time.monotonic() - started, 1),
                 summary={k: v for k, v in comparison.items() if k != "items"}, table=comparison_table(comparison))
    return manifest.data


def load_manifest(out: str | Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.exists():
        raise StropError(f"{out}: no {MANIFEST} here; give the --out folder of a quickstart")
    return json.loads(path.read_text())


def cleanup(out: str | Path) -> dict:
    """Remove what the quickstart in `out` made: its result-table rows (and the tables when nothing else is in
    them), evaluations, tuned model, run, project, datasets and the folder. Nothing else is touched."""
    from sqlalchemy import select

    from strop.control import evaluations, registry, runs
    from strop.evals.tables import delete_comparison
    from strop.store import open_store, session_scope
    from strop.store.schema import Evaluation, Model, Project, Run
    m = load_manifest(out)
    removed: dict[str, list] = {"tables": [], "evaluations": [], "models": [], "runs": [], "projects": [], "datasets": []}
    if m.get("run"):
        status = runs.get(m["run"])["status"] if _exists(Run, m["run"]) else None
        if status in ("pending", "running"):
            raise StropError(f"run {m['run']} is still {status}; `strop runs cancel {m['run']}` first, then clean up")
    if m.get("results"):
        removed["tables"] = delete_comparison(m["results"]["comparisonId"], url=m["results"].get("resultsUrl"))
    with session_scope(open_store()) as s:
        ids = list((m.get("evaluations") or {}).values())
        if m.get("run"):
            ids += s.scalars(select(Evaluation.id).where(Evaluation.run_id == m["run"])).all()
        for evaluation_id in dict.fromkeys(ids):
            if s.get(Evaluation, evaluation_id) is not None:
                s.delete(s.get(Evaluation, evaluation_id))
                removed["evaluations"].append(evaluation_id)
        s.flush()
        if m.get("run"):
            for model in s.scalars(select(Model).where(Model.run_id == m["run"])).all():
                removed["models"].append(model.id)
                s.delete(model)
            s.flush()
            run = s.get(Run, m["run"])
            if run is not None:
                s.delete(run)
                removed["runs"].append(m["run"])
        s.flush()
        if m.get("project"):
            project = s.scalar(select(Project).where(Project.name == m["project"]))
            if project is not None:
                s.delete(project)
                removed["projects"].append(m["project"])
    for name in m.get("datasets") or []:
        if any(d["name"] == name for d in registry.list_datasets()):
            registry.delete("dataset", name)
            removed["datasets"].append(name)
    for evaluation_id in removed["evaluations"]:
        shutil.rmtree(evaluations.eval_dir(evaluation_id), ignore_errors=True)
    for run_id in removed["runs"]:
        shutil.rmtree(runs.run_dir(run_id), ignore_errors=True)
    shutil.rmtree(Path(out), ignore_errors=True)
    return removed


def _exists(table, key) -> bool:
    from strop.store import open_store, session_scope
    with session_scope(open_store(), read_only=True) as s:
        return s.get(table, key) is not None
