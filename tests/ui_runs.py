"""Runs for the `strop ui` tests: real store records and real run folders (metrics.jsonl, rollouts.jsonl,
worker.log) as the worker writes them, and a UI server on loopback in a thread."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

from strop.control.runs import run_dir
from strop.store import open_store, session_scope
from strop.store.schema import Checkpoint, Dataset, DatasetVersion, Evaluation, EvaluationItem, Project, Run

HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def make_run(project: str, *, status: str = "running", steps: int = 3, max_steps: int = 10,
             method: str = "grpo") -> str:
    """A run record (no worker: nothing marks it failed) and `steps` rows of metrics.jsonl in its folder."""
    with session_scope(open_store()) as s:
        found = s.query(Project).filter_by(name=project).one_or_none()
        if found is None:
            found = Project(name=project)
            s.add(found)
            s.flush()
        run = Run(project_id=found.id, descriptor={"config": {"method": method, "rlHyperparams": {"maxSteps": max_steps}}},
                  base_model="strop/tiny-random", status=status, config_name="ui-test",
                  pinned={"baseModel": {"id": "strop/tiny-random"}, "dataset": {"ref": "synthetic:add"}})
        s.add(run)
        s.flush()
        run_id = run.id
        s.add(Checkpoint(run_id=run_id, step=1, path=str(run_dir(run_id) / "checkpoints" / "step-1")))
    folder = run_dir(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.log").write_text("worker started\nstep 0 done\n")
    for step in range(steps):
        write_metrics(run_id, step)
    return run_id


def metrics_row(step: int) -> dict:
    return {"step": step, "epoch": 0, "reward": 0.1 * step, "reward/correct": 0.08 * step, "reward/format": 0.02,
            "rewardStd": 0.3, "zeroVarianceGroups": 0.5, "klSampleTrain": 0.001, "entropy": 1.5 - 0.1 * step,
            "completionLength": 20 + step, "clippedFraction": 0.0, "stepSeconds": 1.2, "learningRate": 1e-4,
            "loss": 0.01}


def write_metrics(run_id: str, step: int) -> None:
    with open(run_dir(run_id) / "metrics.jsonl", "a") as f:
        f.write(json.dumps(metrics_row(step)) + "\n")


def single_turn_rollouts(run_id: str, steps: int = 2, groups: int = 2, group_size: int = 2) -> None:
    rows = []
    for step in range(steps):
        for g in range(groups):
            for k in range(group_size):
                completion = HOSTILE if (step, g, k) == (0, 0, 1) else f"the answer is {step + g + k}"
                rows.append({"step": step, "group": g, "reward": float(k), "advantage": k - 0.5,
                             "prompt": f"what is {step} + {g}?", "question": f"{step}+{g}", "gold": str(step + g),
                             "completion": completion, "scores": {"correct": float(k), "format": 0.1},
                             "tokens": 5, "stop_reason": "stop",
                             "errors": ["grader timed out after 5 s"] if (g, k) == (1, 0) else []})
    with open(run_dir(run_id) / "rollouts.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def finance_episode(step: int, group: int, reward: float) -> dict:
    """A multi-turn finance-sql episode as EnvironmentSource.record writes it."""
    transcript = [
        {"role": "user", "content": "By what percentage did Fairhaven Energy Inc.'s revenue grow from 2021 to 2022?"},
        {"role": "assistant", "content": 'Let me look.\n<tool_call>\n{"name": "list_tables", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": "company, income_statement, balance_sheet, cash_flow, segment_revenue"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "run_sql", "arguments": {"query": '
                                         '"SELECT fiscal_year, revenue FROM income_statement"}}\n</tool_call>'},
        {"role": "tool", "content": "fiscal_year | revenue\n2021 | 1000\n2022 | 1224.9"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "submit_answer", "arguments": {"answer": "22.49%"}}'
                                         '\n</tool_call>'},
    ]
    return {"step": step, "group": group, "reward": reward, "advantage": 0.0, "task": "finance-sql-train-1",
            "question": transcript[0]["content"], "gold": "22.49%", "turns": 3, "transcript": transcript,
            "state": {"listed_tables_first": True}, "info": {"kind": "growth"}, "errors": []}


def make_evaluation(model: str, correct: list[bool], response: str = "the answer is 4") -> str:
    """A finished evaluation of `model` on len(correct) items (the same questions for every call)."""
    with session_scope(open_store()) as s:
        dataset = s.query(Dataset).filter_by(name="ui-questions").one_or_none()
        if dataset is None:
            dataset = Dataset(name="ui-questions")
            s.add(dataset)
            s.flush()
            s.add(DatasetVersion(dataset_id=dataset.id, version=1, sha256="0" * 64, row_count=len(correct)))
            s.flush()
        version = s.query(DatasetVersion).filter_by(dataset_id=dataset.id).one()
        accuracy = sum(correct) / len(correct)
        evaluation = Evaluation(model_ref=model, dataset_version_id=version.id, grader_ref="builtin:gsm8k",
                                status="succeeded", summary={"dataset": {"name": "ui-questions", "version": 1},
                                                             "meanScore": accuracy, "accuracy": accuracy, "n": len(correct)})
        s.add(evaluation)
        s.flush()
        for i, ok in enumerate(correct):
            s.add(EvaluationItem(evaluation_id=evaluation.id, item_index=i, question=f"what is {i} + 2?",
                                 gold=str(i + 2), response=response, extracted=str(i + 2) if ok else "5",
                                 score=float(ok), correct=ok, tokens=4,
                                 judge={"scores": {"clarity": 4}, "reasoning": "short and right"}))
        return evaluation.id


def env_eval_report() -> dict:
    """A `strop envs eval` report with a baseline, shaped as the CLI prints it (episodes hold model text)."""
    def split(passed, rubrics):
        return {"n": 2, "pass@1": passed, "meanReward": passed, "rubrics": rubrics,
                "episodes": [{"passed": True, "reward": 1.0, "text": HOSTILE}]}
    return {"env": "finance-sql", "model": "model-12345678",
            "splits": {"eval-single": split(0.5, {"sqlErrors": 0.25, "validToolCalls": 0.75})},
            "baseline": {"model": "strop/tiny-random", "splits": {"eval-single": split(0.0, {"sqlErrors": 1.0})}},
            "comparison": {"eval-single": {"baseline": 0.0, "model": 0.5, "delta": 0.5, "mcnemarP": 0.5,
                                           "baselineOnly": 0, "modelOnly": 1}}}


@contextmanager
def ui_server(token: str | None = None, host: str = "127.0.0.1"):
    from strop.ui.server import make_server
    server = make_server(host, 0, token)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
