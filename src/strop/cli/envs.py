"""`strop envs list|try|eval|serve`: tool-use environments by hand, by model, and over the network."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from strop.cli.output import add_output_flags, add_ray_flags, add_sampler_flag, emit, format_table, note
from strop.envs import get_env, list_envs
from strop.envs.base import ToolCall
from strop.envs.openenv_server import MAX_MESSAGE_BYTES, serve_env
from strop.errors import StropError
from strop.files import check_regular
from strop.serve.server import exposure_warning


def register(nouns) -> None:
    parser = nouns.add_parser("envs", help="tool-use environments: list, play by hand, evaluate a model, serve",
                              description="Multi-turn tool-use environments (e.g. finance-sql: questions answered "
                                          "with SQL over a company's financial statements).")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    _register_list(verbs)
    _register_try(verbs)
    _register_eval(verbs)
    _register_demos(verbs)
    _register_serve(verbs)


def _register_list(verbs) -> None:
    ls = verbs.add_parser("list", help="the environments", epilog="example:\n  strop envs list",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(ls)
    ls.set_defaults(handler=_list)


def _register_try(verbs) -> None:
    play = verbs.add_parser(
        "try", help="play an episode by hand in the terminal",
        description="Play one episode yourself: type a tool call per line as `TOOL ARG` (e.g. `describe_table "
                    "balance_sheet`, `run_sql SELECT ...`, `submit_answer 12.5`) or as JSON "
                    '{"name": ..., "arguments": {...}}; `tools` lists the tools, `state` shows the episode, `quit` ends.',
        epilog="example:\n  strop envs try finance-sql --split eval-multi --task 3",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    play.add_argument("name", metavar="ENV")
    play.add_argument("--split", default="train", help="which split to draw the task from (default: %(default)s)")
    play.add_argument("--task", type=int, default=0, help="index of the task in that split (default: %(default)s)")
    play.add_argument("--seed", type=int, default=0, help="environment seed (default: %(default)s)")
    play.set_defaults(handler=_try)


def _register_eval(verbs) -> None:
    ev = verbs.add_parser(
        "eval", help="pass@1 of a model per split, with behaviour rubrics",
        description="Evaluate a model in the environment, greedily: pass@1 and mean reward per split, and the "
                    "behaviour rubrics (tables listed before querying, invented names, SQL errors and recoveries, "
                    "turns, answers submitted). MODEL is a base model id or folder, a tuned modelId, or "
                    "openai:NAME@URL (tools passed natively).",
        epilog="example:\n  strop envs eval finance-sql --model HuggingFaceTB/SmolLM2-135M-Instruct --limit 20",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("name", metavar="ENV")
    ev.add_argument("--model", required=True)
    ev.add_argument("--splits", help="comma-separated splits (default: every split but train)")
    ev.add_argument("--limit", type=int, help="tasks per split")
    ev.add_argument("--seed", type=int, default=0, help="environment seed (default: %(default)s)")
    ev.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply (default: %(default)s)")
    ev.add_argument("--api-key-env", default="OPENAI_API_KEY", help="API key variable for openai:NAME@URL")
    ev.add_argument("--baseline", metavar="MODEL", help="also evaluate this model on the same tasks and compare "
                                                        "(per split: pass@1 of each, delta, exact McNemar p)")
    ev.add_argument("--samples", type=int, metavar="K",
                    help="also play each task K times sampled (2 to 1,024) and report headroom per kind of task: "
                         "greedy pass@1, sampled pass@1, pass@K and the RL pool (tasks solved 1 to K-1 times)")
    ev.add_argument("--temperature", type=float, default=1.0,
                    help="temperature of the --samples episodes (default: %(default)g)")
    ev.add_argument("--pool-out", type=Path, metavar="FILE",
                    help="with --samples: write the RL-pool tasks to FILE as JSON lines (environment, options, "
                         "split, index, task id, kind, successes of K); FILE must not exist")
    ev.add_argument("--pool-min", type=int, default=1, metavar="M",
                    help="with --pool-out: keep the tasks solved at least M times and missed at least M times of K "
                         "(default: %(default)s, every task solved 1 to K-1 times). 2 of 16 keeps tasks a group "
                         "will likely have both outcomes on: one success in a few samples is mostly luck")
    add_output_flags(ev)
    add_sampler_flag(ev)
    add_ray_flags(ev, env_workers=True)
    ev.set_defaults(handler=_eval)


def _register_demos(verbs) -> None:
    demos = verbs.add_parser(
        "demos", help="write demonstrations: transcripts of a scripted agent, for a supervised warm start",
        description="Write demonstrations of ENV's train split as JSON lines, one transcript per line in OpenAI's "
                    "chat format ({\"messages\": [...], \"tools\": [...]}, assistant turns with tool_calls, tool "
                    "results as role tool). A scripted agent solves each task the way a good agent would (list the "
                    "tables, describe the ones it needs, query them, submit the number); in a --mistakes share of "
                    "episodes it first uses a table or column name that does not exist, reads the error and "
                    "recovers (the mistaken turn carries \"weight\": 0, so a warm start learns the recovery, not the "
                    "mistake). --companies spreads the transcripts over that many training companies, so a model "
                    "reads each company's figures rather than memorising a few. Every transcript is played against the environment, and only answers it scored "
                    "correct are kept. The evaluation splits are never demonstrated.",
        epilog="examples:\n  strop envs demos finance-sql --n 300 -o demos.jsonl\n"
               "  strop envs demos finance-sql --n 1000 --mistakes 0.4 --seed 1 -o more.jsonl\n"
               "  strop envs demos finance-sql --n 300 --companies 20 -o spread.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    demos.add_argument("name", metavar="ENV", help="an environment with a scripted agent: finance-sql")
    demos.add_argument("-o", "--out", required=True, type=Path, help="the .jsonl file to write (must not exist)")
    demos.add_argument("--n", type=int, default=300, help="demonstrations to write (default: %(default)s)")
    demos.add_argument("--split", default="train", help="the split to demonstrate: train only (default)")
    demos.add_argument("--mistakes", type=float, default=0.25,
                       help="share of episodes that make a mistake and recover, 0 to 1 (default: %(default)s)")
    demos.add_argument("--seed", type=int, default=0, help="environment seed (default: %(default)s)")
    demos.add_argument("--companies", type=int, metavar="N",
                       help="draw the tasks from N training companies, 1 to 80 (default: as few as hold --n tasks); "
                            "the evaluation splits' companies are never drawn")
    demos.set_defaults(handler=_demos)  # -o is the file here, so no output-format flags


def _register_serve(verbs) -> None:
    serve = verbs.add_parser(
        "serve", help="serve an environment over OpenEnv's protocol (WebSocket /ws, /health, /schema)",
        description="Serve ENV so OpenEnv clients (and strop's RemoteEnv) can use it; each connection gets its own "
                    "episode. Binds to 127.0.0.1 unless --host says otherwise.",
        epilog="example:\n  strop envs serve finance-sql --port 8010 --api-key-env ENV_KEY",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("name", metavar="ENV")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    serve.add_argument("--port", type=int, default=8010, help="port (default: %(default)s)")
    serve.add_argument("--seed", type=int, default=0, help="environment seed (default: %(default)s)")
    serve.add_argument("--api-key-env", metavar="VAR", help="require the key held in environment variable VAR")
    serve.add_argument("--max-message-bytes", type=int, metavar="N",
                       help="refuse request bodies and WebSocket frames over N bytes (default: 1048576)")
    serve.add_argument("--max-sessions", type=int, default=64, metavar="N",
                       help="episodes (connections) served at once; more are refused until one closes "
                            "(default: %(default)s)")
    serve.add_argument("--session-idle-timeout", type=float, default=600.0, metavar="SECONDS",
                       help="close a session that sends no message for this long, so idle clients cannot hold every "
                            "slot (default: %(default)g; a slow model's turn can take minutes)")
    serve.set_defaults(handler=_serve)


def _list(args) -> int:
    emit(args, list_envs(), lambda rs: format_table(rs, [("name", "NAME"), ("description", "DESCRIPTION")]))
    return 0


def _parse_line(line: str):
    line = line.strip()
    if line.startswith("{"):
        try:
            data = json.loads(line)
        except RecursionError:
            raise ValueError("the JSON nests too deeply") from None
        return ToolCall(data["name"], data.get("arguments") or {})
    name, _, rest = line.partition(" ")
    argument = {"describe_table": "table", "run_sql": "query", "submit_answer": "answer"}.get(name)
    if argument and rest:
        return ToolCall(name, {argument: rest.strip()})
    return ToolCall(name, dict(pair.split("=", 1) for pair in shlex.split(rest)) if rest else {})


def _try(args) -> int:
    env = get_env(args.name, seed=args.seed)
    try:
        tasks = env.tasks(args.split)
        if not 0 <= args.task < len(tasks):
            raise StropError(f"--task must be between 0 and {len(tasks) - 1} for split {args.split!r}")
        print(env.reset(tasks[args.task]).content)
        print("tools: " + ", ".join(t["function"]["name"] for t in env.tools()) + "   (type `tools`, `state` or `quit`)")
        while True:
            print("> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() == "quit":
                break
            if not line.strip():
                continue
            if line.strip() == "tools":
                print(json.dumps(env.tools(), indent=1))
                continue
            if line.strip() == "state":
                print(json.dumps(env.state(), indent=1))
                continue
            try:
                call = _parse_line(line)
            except (ValueError, KeyError) as exc:
                print(f"could not read that call ({exc}); write `TOOL ARG` or JSON")
                continue
            result = env.step(call)
            print(result.observation.content)
            if result.done:
                print(f"episode over: reward {result.reward:g}" + (f", {result.info}" if result.info else ""))
                break
        return 0
    finally:
        env.close()


def _adapter_target(folder: Path, resolve_model) -> dict:
    """A LoRA adapter folder as an evaluation target: its base is the folder or model id its adapter_config.json
    names (`base_model_name_or_path`, which strop's trainer writes)."""
    try:
        check_regular(folder / "adapter_config.json", what="adapter file adapter_config.json")  # not a FIFO
        base = json.loads((folder / "adapter_config.json").read_text(errors="replace")[:1_000_000])[
            "base_model_name_or_path"]
        if not isinstance(base, str) or not base:
            raise TypeError("not a name")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StropError(f"--model {folder}: an adapter folder whose adapter_config.json names no base model "
                         f"({exc}); evaluate it as a tuned model (`strop models list`) instead") from None
    if Path(base).is_dir():
        return {"basePath": base, "adapter": str(folder)}
    return {**resolve_model(base), "adapter": str(folder)}


def _evaluate(args, model_ref: str) -> dict:
    # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control.evaluations import resolve_model
    from strop.evals.envs import evaluate_env
    # a model folder is used as it is, an adapter folder (a run's final/) on the base it names; ids go through the
    # store (tuned modelIds, selected base models)
    if (Path(model_ref) / "adapter_config.json").is_file():
        target = _adapter_target(Path(model_ref), resolve_model)
    elif Path(model_ref).is_dir():
        target = {"basePath": model_ref}
    else:
        target = resolve_model(model_ref)
    report = evaluate_env(target.get("openai") or target["basePath"], args.name,
                          splits=args.splits.split(",") if args.splits else None, limit=args.limit,
                          options={"seed": args.seed}, adapter=target.get("adapter"), max_tokens=args.max_tokens,
                          api_key_env=args.api_key_env, samples=args.samples, temperature=args.temperature,
                          seed=args.seed)
    return {**report, "model": model_ref}


def _eval(args) -> int:
    # lazy: strop.evals.stats pulls in torch, numpy, which importing this module does not need
    from strop.evals.stats import discordant, mcnemar_exact
    if args.pool_out is not None:
        if args.samples is None:
            raise StropError("--pool-out needs --samples K: the RL pool is the tasks solved 1 to K-1 times of K")
        if args.pool_out.exists():
            raise StropError(f"--pool-out {args.pool_out} exists; choose another file (it is never written over)")
        if not isinstance(args.pool_min, int) or not 1 <= args.pool_min <= args.samples // 2:
            raise StropError(f"--pool-min must be from 1 to half of --samples ({args.samples // 2}): a task must "
                             f"be solvable and missable that many times of {args.samples}; got {args.pool_min}")
    elif args.pool_min != 1:
        raise StropError("--pool-min applies to --pool-out (the RL pool written); add --samples K --pool-out FILE")
    report = _evaluate(args, args.model)
    if args.pool_out is not None:
        report["poolOut"] = {"path": str(args.pool_out), "least": args.pool_min,
                             "tasks": _write_pool(args.pool_out, report, {"seed": args.seed}, args.pool_min)}
    if args.baseline:
        base = _evaluate(args, args.baseline)
        report["baseline"] = base
        report["comparison"] = {}
        for split, s in report["splits"].items():
            a = [e["passed"] for e in base["splits"][split]["episodes"]]
            b = [e["passed"] for e in s["episodes"]]
            only_a, only_b = discordant(a, b)
            report["comparison"][split] = {"baseline": base["splits"][split]["pass@1"], "model": s["pass@1"],
                                           "delta": s["pass@1"] - base["splits"][split]["pass@1"],
                                           "mcnemarP": mcnemar_exact(only_a, only_b), "baselineOnly": only_a,
                                           "modelOnly": only_b}

    # kept for `strop ui` (its evaluations page shows pass@1, rubrics and headroom per split)
    from strop.control.env_evals import save
    report["envEvalId"] = save({"env": args.name, **report})

    def show(r):
        lines = [f"{r['envEvalId']} (shown in `strop ui`)"]
        for who in ([r["baseline"]] if "baseline" in r else []) + [r]:
            lines.append(f"{args.name}: {who['model']}")
            for split, s in who["splits"].items():
                rubrics = "  ".join(f"{k} {v:.2f}" for k, v in s["rubrics"].items())
                lines.append(f"  {split:<14} pass@1 {s['pass@1']:.1%} ({s['n']} tasks)  mean reward "
                             f"{s['meanReward']:.3f}  {rubrics}")
            if "headroom" in who:
                lines.append(headroom_table(who["headroom"]))
        for split, c in (r.get("comparison") or {}).items():
            lines.append(f"{split}: {c['model']:.1%} vs baseline {c['baseline']:.1%} ({c['delta']:+.1%}), exact McNemar "
                         f"p = {c['mcnemarP']:.3g} ({c['baselineOnly']} only baseline, {c['modelOnly']} only model)")
        if "poolOut" in r:
            least, k = r["poolOut"]["least"], r["headroom"]["samples"]
            lines.append(f"wrote {r['poolOut']['tasks']} RL-pool tasks (solved {least}..{k - least} times of {k}) "
                         f"to {r['poolOut']['path']}")
        return "\n".join(lines)
    emit(args, report, show)
    return 0


def headroom_table(h: dict) -> str:
    """One row per split and kind, a row per split, and one over every task."""
    k = h["samples"]
    columns = [("split", "SPLIT"), ("kind", "KIND"), ("tasks", "TASKS"), ("greedy", "GREEDY PASS@1"),
               ("sampled", "SAMPLED PASS@1"), ("passk", f"PASS@{k}"), ("rlPool", f"RL POOL (1..{k - 1} OF {k})")]

    def row(split, kind, f):
        return {"split": split, "kind": kind, "tasks": f["tasks"], "greedy": f"{f['greedyPass@1']:.1%}",
                "sampled": f"{f['sampledPass@1']:.1%}", "passk": f"{f[f'pass@{k}']:.1%}", "rlPool": f["rlPool"]}
    rows = []
    for split, s in h["splits"].items():
        rows += [row(split, kind, f) for kind, f in s["kinds"].items()] + [row(split, "all", s["all"])]
    if len(h["splits"]) > 1:
        rows.append(row("all", "all", h["all"]))
    title = f"  headroom: each task once greedily and {k} times sampled at temperature {h['temperature']:g}"
    return title + "\n" + "\n".join("    " + line for line in format_table(rows, columns).splitlines())


def _write_pool(path: Path, report: dict, options: dict, least: int = 1) -> int:
    # lazy: the statistics module loads only for this command
    from strop.evals.headroom import TaskOutcome, pool_rows
    rows = pool_rows([TaskOutcome(**t) for t in report["headroom"]["tasks"]], report["environment"], options, least)
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(partial, path)  # a failure part-way leaves no half-written file under the name asked for
    finally:
        partial.unlink(missing_ok=True)
    return len(rows)


def _demos(args) -> int:
    # lazy: the scripted agent and its environment load only for this command
    from strop.envs.finance_data import MAX_COMPANIES
    from strop.envs.finance_demos import demonstrations
    from strop.envs.finance_sql import FinanceSQLEnv
    if args.name != "finance-sql":
        raise StropError(f"strop has a scripted agent for finance-sql only, not {args.name!r}; write demonstrations "
                         "for another environment as OpenAI-format transcripts yourself")
    if args.n < 1:
        raise StropError(f"--n must be at least 1, got {args.n}")
    if args.out.exists():
        raise StropError(f"{args.out} exists; choose another -o (demonstrations are never written over a file)")
    per_company = len(FinanceSQLEnv(seed=args.seed).tasks("train"))
    companies = min(MAX_COMPANIES, -(-args.n // per_company)) if args.companies is None else args.companies
    if not 1 <= companies <= MAX_COMPANIES:
        raise StropError(f"--companies must be from 1 to {MAX_COMPANIES} (the training companies there are), got "
                         f"{companies}")
    # each split has its own companies (strop.envs.finance_data), so any number of train companies leaves the
    # evaluation splits' unseen; the tasks of all of them are shuffled together, so the first --n spread evenly
    env = FinanceSQLEnv(seed=args.seed, companies=companies)
    if args.split == "train" and len(env.tasks("train")) < args.n:
        env.close()
        raise StropError(f"--companies {companies} hold {len(env.tasks('train'))} train tasks, fewer than --n "
                         f"{args.n}; raise --companies or lower --n")
    partial = args.out.with_name(f".{args.out.name}.partial")
    written = mistakes = recovered = 0
    drawn_from = set()
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "w", encoding="utf-8") as f:
            for demo in demonstrations(env, split=args.split, n=args.n, mistakes=args.mistakes, seed=args.seed):
                f.write(json.dumps({k: demo[k] for k in ("messages", "tools", "task", "mistake", "reward")}) + "\n")
                written += 1
                mistakes += demo["mistake"]
                recovered += demo["state"].get("recoveries", 0) > 0
                drawn_from.add(demo["task"].split("/")[3])  # finance-sql/s0/train/c12/q003: its company
        os.replace(partial, args.out)  # a failure part-way leaves no half-written file under the name asked for
    finally:
        partial.unlink(missing_ok=True)
        env.close()
    print(f"wrote {written} demonstrations to {args.out} ({mistakes} with a mistake, {recovered} recovered; "
          f"from {len(drawn_from)} of {companies} training compan{'y' if companies == 1 else 'ies'})")
    return 0


def _serve(args) -> int:
    # lazy: its name is also bound at module level here
    from strop.errors import StropError
    if args.max_message_bytes is None:
        args.max_message_bytes = MAX_MESSAGE_BYTES
    if args.max_message_bytes < 1:
        raise StropError(f"--max-message-bytes must be at least 1, got {args.max_message_bytes}")
    if args.max_sessions < 1:
        raise StropError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if not 0 < args.session_idle_timeout < float("inf"):
        raise StropError(f"--session-idle-timeout must be a positive number of seconds, got "
                         f"{args.session_idle_timeout:g}")
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise StropError(f"--api-key-env {args.api_key_env}: that variable is not set")
    warning = exposure_warning(args.host, key)
    if warning:
        note(warning)
    note(f"serving {args.name} on ws://{args.host}:{args.port}/ws (Ctrl-C stops it)")
    serve_env(args.name, host=args.host, port=args.port, api_key=key, options={"seed": args.seed},
              max_message_bytes=args.max_message_bytes, max_sessions=args.max_sessions,
              session_idle_s=args.session_idle_timeout)
    return 0
