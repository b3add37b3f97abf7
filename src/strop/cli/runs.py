"""`strop runs start|wait|get|list|cancel|resume|metrics|tensorboard`: runs in the background."""

from __future__ import annotations

import argparse
import os
import sys

from strop.cli.output import add_output_flags, emit, format_table, note
from strop.names import escape_hidden

METRIC_COLUMNS = [("step", "STEP"), ("zeroVarianceGroups", "ZERO-VAR"), ("reward", "REWARD"), ("rewardStd", "STD"),
                  ("klSampleTrain", "KL(S|T)"), ("entropy", "ENTROPY"), ("completionLength", "LENGTH"),
                  ("clippedFraction", "CLIPPED"), ("rewardErrors", "ERRORS"), ("stepSeconds", "SECONDS")]


def register(nouns) -> None:
    parser = nouns.add_parser("runs", help="start training runs from a descriptor and follow them",
                              description="Training runs. `start` validates a run descriptor (a run.json), "
                                          "pins the exact dataset and bundle versions, and trains in a background "
                                          "worker; the other verbs follow and control it.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(name, help_, example, handler, run_arg=True):
        p = verbs.add_parser(name, help=help_, description=help_, epilog=f"example:\n  {example}",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        if run_arg:
            p.add_argument("run", metavar="RUN", help="a run id, e.g. run-3f9a1c2e")
        add_output_flags(p)
        p.set_defaults(handler=handler)
        return p

    start = verb("start", "validate, admit and start a run (prints its runId)",
                 "RUN=$(strop runs start -f run.json -o json --jq .runId)", _start, run_arg=False)
    start.add_argument("-f", "--file", required=True, help="the run descriptor (JSON)")
    start.add_argument("--ray-address", metavar="auto|HOST:PORT",
                       help="run its sampler replicas and environment workers on this Ray cluster (sets "
                            "execution.ray.address; the descriptor's samplers and envWorkers are kept, else 1 "
                            "replica and environments in the trainer's process). \"auto\": the cluster "
                            "`ray start --head` started on this machine. Needs pip install -e \".[ray]\"")
    start.add_argument("--dry-run", action="store_true",
                       help="validate and check admission only, and say how many steps and passes over the rows the "
                            "run would make (maxSteps is the number of steps, the rows reshuffled each pass until it "
                            "is reached; without maxSteps, epochs passes); start nothing")
    wait = verb("wait", "wait until the run finishes, showing its progress", 'strop runs wait "$RUN" --exit-status', _wait)
    wait.add_argument("--exit-status", action="store_true", help="exit 0 only if the run succeeded")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds")
    verb("get", "show a run: status, step, modelId, pinned versions, timings", 'strop runs get "$RUN" -o json --jq .modelId',
         _get)
    ls = verb("list", "list runs, newest first", "strop runs list --project gsm8k", _list, run_arg=False)
    ls.add_argument("--project", help="only this project's runs")
    verb("cancel", "stop a running run (it keeps its checkpoints)", 'strop runs cancel "$RUN"', _cancel)
    verb("resume", "continue a failed or cancelled run from its last checkpoint", 'strop runs resume "$RUN"', _resume)
    verb("metrics", "the per-step metrics table (zeroVarianceGroups first, then reward)", 'strop runs metrics "$RUN"',
         _metrics)
    tb = verb("tensorboard", "serve the run's TensorBoard event files", 'strop runs tensorboard "$RUN" --port 6006',
              _tensorboard)
    tb.add_argument("--print-logdir", action="store_true", help="print the event folder and exit")
    tb.add_argument("--port", type=int, default=6006, help="port on 127.0.0.1 (default: %(default)s)")


def _printable(r: dict) -> dict:
    """The run with the names people gave it escaped for a terminal (a record stored before names were checked
    could hold a bidirectional override or an escape sequence); JSON output keeps them as stored."""
    return {**r, **{k: escape_hidden(r[k]) for k in ("project", "configName", "baseModel") if isinstance(r.get(k), str)}}


def _show(r: dict) -> str:
    r = _printable(r)
    lines = [f"run: {r['runId']}  ({r['project']} / {r['configName']})", f"status: {r['status']}",
             f"step: {r['step']}" + (f" of {_total(r)}" if _total(r) else ""),
             f"base model: {r['baseModel']}", f"model: {r['modelId'] or '-'}"]
    pinned = r.get("pinned") or {}
    if r.get("passes"):
        lines.append(f"passes over the rows: {r['passesMade']} of {r['passes']}")
    if "dataset" in pinned:
        lines.append(f"dataset: {pinned['dataset']['ref']}")
    if "environment" in pinned:
        lines.append(f"environment: {pinned['environment']['name']} ({pinned['environment']['split']})")
    for term in pinned.get("terms", []):
        lines.append(f"reward term {term['name']}: {term.get('bundle') or term.get('builtin')} x {term['weight']}")
    cluster = r.get("cluster")
    if cluster:
        ray = cluster.get("rayCluster") or {}
        nodes = ray.get("nodes") or []
        lines.append(f"Ray cluster: {ray.get('address')} (Ray {ray.get('rayVersion')}, {len(nodes)} node"
                     f"{'s' if len(nodes) != 1 else ''}, {ray.get('cpus', 0):g} CPUs, {ray.get('gpus', 0):g} GPUs)")
        trainer = cluster.get("trainer")
        if trainer and trainer.get("dataParallel"):
            lines.append(f"{trainer['dataParallel']} data-parallel trainers ({trainer.get('backend')}, "
                         f"{trainer.get('dtype')}): " + ", ".join(f"node {t.get('node')} (pid {t.get('pid')})"
                                                                   for t in trainer.get("replicas") or []))
        elif trainer:
            lines.append(f"trainer: node {trainer.get('node')} (pid {trainer.get('pid')}, {trainer.get('dtype')})")
        replicas = cluster.get("samplerReplicas") or []
        if replicas:
            lines.append(f"{len(replicas)} sampler replica{'s' if len(replicas) != 1 else ''}: " + ", ".join(
                f"{r.get('sampler')} on node {r.get('node')} (pid {r.get('pid')})" for r in replicas))
        graders = cluster.get("graderWorkers") or []
        if graders:
            lines.append(f"{len(graders)} grader worker{'s' if len(graders) != 1 else ''} (pids "
                         f"{', '.join(str(g.get('pid')) for g in graders)})")
        workers = cluster.get("envWorkers") or []
        if workers:
            lines.append(f"{len(workers)} environment worker{'s' if len(workers) != 1 else ''}: " + ", ".join(
                f"{w.get('environments')} environments (pid {w.get('pid')})" for w in workers))
    if r.get("evaluations"):
        lines.append(f"evaluations: {', '.join(r['evaluations'])}")
    if r.get("workerPid"):
        # lazy: strop.control.processes pulls in pydantic, which importing this module does not need
        from strop.control.processes import this_host
        host = r.get("workerHost")
        if host and host != this_host():
            lines.append(f"running on {host} (worker pid {r['workerPid']} there; only that machine can tell "
                         f"whether it still runs)")
        else:
            lines.append(f"worker pid: {r['workerPid']}")
    if r.get("seconds") is not None:
        lines.append(f"seconds: {r['seconds']}")
    if r.get("error"):
        lines.append(f"error: {r['error']}")
    lines.append(f"folder: {r['runDir']}")
    return "\n".join(lines)


def _total(r: dict):
    return r.get("steps") or r.get("maxSteps")


def _plan(pinned: dict) -> str:
    """'100 steps of 8 prompts: 4 passes over 200 rows', as the run will make them."""
    plan = pinned.get("plan")
    if not plan:
        return ""
    passes = "1 pass" if plan["passes"] == 1 else f"{plan['passes']} passes"
    return f"\n{plan['steps']} steps of {plan['batchSize']} prompts: {passes} over {plan['rows']} rows"


def _start(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    result = runs.start(args.file, dry_run=args.dry_run, ray_address=args.ray_address)
    if args.dry_run:
        emit(args, result, lambda r: "descriptor is valid and admissible: " + (
            f"dataset {r['pinned']['dataset']['ref']}, {len(r['pinned']['terms'])} reward term(s)" if "dataset" in r["pinned"]
            else f"environment {r['pinned']['environment']['name']}") + f", base model {r['pinned']['baseModel']['id']}"
            + _plan(r["pinned"]) + "".join(f"\nnot checked: {line}" for line in r.get("notChecked", [])))
    else:
        emit(args, result, lambda r: r["runId"])
    return 0


def _wait(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    last = {}

    def show(info):
        if sys.stderr.isatty() or info["step"] != last.get("step") or info["status"] != last.get("status"):
            total = f"/{_total(info)}" if _total(info) else ""
            note(f"{info['runId']}: {info['status']}, step {info['step']}{total}")
        last.update(info)

    info = runs.wait(args.run, timeout=args.timeout, on_poll=show)
    emit(args, info, _show)
    return 0 if (info["status"] == "succeeded" or not args.exit_status) else 1


def _get(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    emit(args, runs.get(args.run), _show)
    return 0


def _list(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    emit(args, runs.list_runs(args.project), lambda rs: format_table([_printable(r) for r in rs], [
        ("runId", "RUN"), ("project", "PROJECT"), ("configName", "CONFIG"), ("status", "STATUS"), ("step", "STEP"),
        ("modelId", "MODEL"), ("createdAt", "CREATED")]))
    return 0


def _cancel(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    emit(args, runs.cancel(args.run), _show)
    return 0


def _resume(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    emit(args, runs.resume(args.run), lambda r: f"{r['runId']} resumed (worker {r['workerPid']})")
    return 0


def _metrics(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    rows = runs.metrics(args.run)

    def table(rs):
        terms = sorted({k for r in rs for k in r if k.startswith("reward/")})
        cols = METRIC_COLUMNS[:3] + [(t, t.upper()) for t in terms] + METRIC_COLUMNS[3:]
        return format_table(rs, cols) if rs else "no steps recorded yet"
    emit(args, rows, table)
    return 0


def _tensorboard(args) -> int:
    # lazy: strop.control.runs pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import runs
    runs.get(args.run)  # a clear error for an unknown run
    logdir = runs.run_dir(args.run) / "events"
    if args.print_logdir:
        emit(args, {"logdir": str(logdir)}, lambda r: r["logdir"])
        return 0
    note(f"TensorBoard on http://127.0.0.1:{args.port}/ (Ctrl-C stops it)")
    sys.stdout.flush()
    sys.stderr.flush()
    # become TensorBoard rather than start it as a child: stopping this command (a signal, a killed
    # terminal) then stops TensorBoard too, instead of leaving it serving in the background
    os.execv(sys.executable, [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                              "--host", "127.0.0.1", "--port", str(args.port)])
