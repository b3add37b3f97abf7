"""`strop train`: run the GRPO loop on one machine, in the foreground, with progress.

    strop train --base-model strop/tiny-random --dataset synthetic:add --steps 5 --group-size 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from strop.cli.output import add_output_flags, emit, format_table
from strop.errors import StropError
from strop.paths import runs_dir, safe_name
from strop.cli.setting_flags import add_setting_flags, given_flags, given_settings
from strop.rl.config import GRPOConfig
from strop.scoring.bundles import absolute_ref
from strop.sft.config import SFTConfig


def register(nouns) -> None:
    p = nouns.add_parser(
        "train", help="fine-tune a base model with GRPO + LoRA on a dataset",
        description="Fine-tune a base model with GRPO + LoRA. Each step samples --group-size completions for "
                    "--batch-size prompts, scores them with the reward terms, and updates the adapter. The run "
                    "folder (printed first) gets config.json, metrics.jsonl, rollouts.jsonl, TensorBoard events, "
                    "checkpoints/ and final/ (the tuned PEFT adapter). Run the same command with --run-dir of a "
                    "stopped run to resume it from its last checkpoint.",
        epilog="examples:\n"
               "  strop train --base-model strop/tiny-random --dataset synthetic:add --steps 3\n"
               "  strop train --dataset gsm8k --reward builtin:gsm8k=1.0 --reward builtin:gsm8k-format=0.1\n"
               "  strop train --dataset data/train.jsonl --reward ./scoring#reward:compute_score\n"
               "  strop train --environment finance-sql --group-size 8 --branch-at-turn 3",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_setting_flags(p, GRPOConfig, SFTConfig)  # --group-size, --lr, ...: from the settings' declarations
    p.add_argument("--environment", metavar="ENV",
                   help="train in a tool-use environment's episodes instead of on --dataset: a registered one "
                        "(finance-sql; `strop envs list`), an OpenEnv server's URL or package.module:ClassName; "
                        "rewarded by the environment, on its train split")
    p.add_argument("--env-option", action="append", metavar="KEY=VALUE",
                   help="an option of --environment (VALUE read as JSON where it parses, else as text), e.g. "
                        "seed=3; repeat for several")
    p.add_argument("--env-tasks", type=Path, metavar="POOL.jsonl",
                   help="train on these tasks of --environment's split only: the RL pool `strop envs eval ENV "
                        "--splits train --samples K --pool-out POOL.jsonl` wrote (tasks solved 1 to K-1 times of K, "
                        "where a group has something to learn)")
    p.add_argument("--reward", action="append", metavar="REF[=WEIGHT]",
                   help="a reward term: builtin:gsm8k, builtin:gsm8k-format or DIR[#MODULE[:FUNCTION]], with an "
                        "optional weight (default 1.0); repeat for several terms (default: builtin:gsm8k)")
    p.add_argument("--run-dir", type=Path, help="run folder (default: $STROP_HOME/runs/<time>-<model>)")
    p.add_argument("--method", choices=("grpo", "sft"), default="grpo",
                   help="grpo (default), or sft: supervised fine-tuning on --dataset FILE.jsonl of chat transcripts "
                        "({\"messages\": [...], \"tools\": [...]}, e.g. from `strop envs demos`) or prompt/completion "
                        "pairs, the assistant's tokens only; it takes the flags not marked \"grpo:\"")
    p.add_argument("--ray-address", metavar="auto|HOST:PORT",
                   help="run on this Ray cluster (pip install -e \".[ray]\"): the trainer (--trainers of them) on "
                        "actors of their own, and for GRPO the sampler replicas; \"auto\": the cluster "
                        "`ray start --head` started on this machine")
    p.add_argument("--samplers", type=int, help="sampler replicas on the Ray cluster (default: 1; needs --ray-address)")
    p.add_argument("--trainers", type=int,
                   help="data-parallel trainers on the Ray cluster, a GPU each where it has enough, else CPUs "
                        "(default: 1; needs --ray-address): each takes a share of a step's datums and their "
                        "gradients are summed before every update, which stays the one trainer's update")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_output_flags(p)
    p.set_defaults(handler=run)


RAY_FLAGS = "--ray-address/--samplers/--trainers"


def config_values(args, rewards: list[dict]) -> dict:
    """The run config's values the flags give (a flag left out keeps the config's default)."""
    values = given_settings(args, GRPOConfig)
    if args.environment is not None:
        values["environment"] = {"name": args.environment, "options": env_options(args.env_option or []),
                                 "split": "train"}
        if args.env_tasks is not None:  # absolute, as init_adapter: a resumed run reads it from anywhere
            values["environment"]["tasks"] = str(args.env_tasks.resolve())
    elif args.env_option or args.env_tasks is not None:
        flag = "--env-option sets an option" if args.env_option else "--env-tasks chooses the tasks"
        raise StropError(f"{flag} of --environment: give --environment too")
    if values.get("init_adapter"):  # absolute, so a resumed run finds it wherever it is started from
        values["init_adapter"] = str(Path(values["init_adapter"]).resolve())
    if args.ray_address is not None or args.samplers is not None or args.trainers is not None:
        if args.ray_address is None:
            flag = "--samplers places sampler replicas" if args.samplers is not None else "--trainers places trainers"
            raise StropError(f"{flag} on a Ray cluster: give --ray-address too")
        values["ray"] = {"address": args.ray_address, "samplers": 1 if args.samplers is None else args.samplers,
                         "trainers": 1 if args.trainers is None else args.trainers}
    return {**values, "reward_terms": rewards}


def flag_problems(args, rewards: list[dict]) -> list[str]:
    """'--group-size (group_size): must be an integer from 2 to 1,024 (got ...); why' for each flag out of range:
    the flags are checked by the run config's one validator (GRPOConfig.problems_of, the one the run descriptor
    and the Python API use) before anything loads."""
    flags = {field: flag for flag, field in GRPOConfig.flags().items()}
    problems = []
    for name, problem in GRPOConfig.problems_of(config_values(args, rewards)):
        if name in flags:
            problems.append(f"{flags[name]} ({name}): {problem}")
        elif name == "ray":
            problems.append(f"{RAY_FLAGS}: {problem}")
        elif name == "environment":
            problems.append(f"--environment/--env-option/--env-tasks: {problem}")
        elif name.startswith("reward_terms[") and args.reward:
            spec = args.reward[int(name[len("reward_terms["):name.index("]")])]
            problems.append(f"--reward {spec[:80]!r}: the weight {problem}")
        else:
            problems.append(f"{name}: {problem}")
    return problems


def env_options(specs: list[str]) -> dict:
    """--env-option KEY=VALUE pairs as the environment's options: VALUE as JSON where it parses (3, true,
    "text"), else the text itself."""
    options = {}
    for spec in specs:
        key, eq, value = spec.partition("=")
        if not eq or not key.strip():
            raise StropError(f"--env-option {spec[:80]!r}: give KEY=VALUE, e.g. seed=3")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def parse_reward(spec: str) -> dict:
    ref, _, weight = spec.partition("=")
    if not ref:
        raise StropError(f"--reward {spec!r}: give a grader reference such as builtin:gsm8k or ./scoring#reward")
    try:
        # absolute, so config.json and the sandboxed workers (which run elsewhere) name the same folder
        return {"grader": absolute_ref(ref), "weight": float(weight) if weight else 1.0}
    except ValueError:
        raise StropError(f"--reward {spec!r}: the weight after '=' must be a number, e.g. builtin:gsm8k=1.0") from None


# how a run is reported is not what it trains: a resumed run may report to other trackers than it started with
REPORTING = ("report_to", "report_rollouts_every")


def run(args) -> int:
    if args.method == "sft":
        return run_sft_command(args)
    # lazy: strop.rl.grpo pulls in torch, transformers, which importing this module does not need
    from strop.rl import run_grpo

    other = [flag for flag in given_flags(args, SFTConfig) if flag not in GRPOConfig.flags()]
    if other:
        raise StropError(f"{', '.join(other)}: {'a setting' if len(other) == 1 else 'settings'} of --method sft, "
                         "which GRPO does not take")
    rewards = [parse_reward(s) for s in (args.reward or ["builtin:gsm8k"])]
    problems = flag_problems(args, rewards)
    if problems:
        raise StropError("invalid flags:\n  " + "\n  ".join(problems))
    config = GRPOConfig(**config_values(args, rewards))
    run_dir = args.run_dir or runs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe_name(config.base_model)}"
    if run_dir.exists() and (run_dir / "config.json").exists():
        # a setting added since the run was made reads as its default, so an older run folder still resumes
        saved = {**GRPOConfig.defaults(), **json.loads((run_dir / "config.json").read_text())}
        wanted = config.to_dict()
        changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k) and k not in REPORTING)
        if changed:
            raise StropError(f"{run_dir} holds a run with a different config (differs in {', '.join(changed)}); "
                             "resume it with the same flags, or choose another --run-dir")
    result = run_grpo(config, run_dir, progress=not args.quiet, announce=True)
    last = result.metrics[-1] if result.metrics else {}
    summary = {"runDir": str(result.run_dir), "steps": result.steps, "finalAdapter": str(result.final_adapter),
               "firstReward": result.metrics[0]["reward"] if result.metrics else None,
               "lastReward": last.get("reward"), "metrics": str(result.run_dir / "metrics.jsonl")}
    emit(args, summary, lambda s: _table(result.metrics) + f"\n\nrun folder: {s['runDir']}\ntuned adapter: {s['finalAdapter']}")
    return 0


def run_sft_command(args) -> int:
    # lazy: the trainer pulls in torch, transformers and peft
    from strop.sft import run_sft
    given = [flag for flag in given_flags(args, GRPOConfig) if flag not in SFTConfig.flags()]
    given += [flag for flag in ("--reward", "--samplers", "--environment", "--env-option", "--env-tasks")
              if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given:
        raise StropError(f"{', '.join(given)}: {'a GRPO setting' if len(given) == 1 else 'GRPO settings'}, which "
                         "--method sft does not take")
    if args.dataset is None:
        raise StropError("--method sft needs --dataset FILE.jsonl: chat transcripts ({\"messages\": [...]}, e.g. from "
                         "`strop envs demos finance-sql -o demos.jsonl`) or {\"prompt\", \"completion\"} pairs")
    values = given_settings(args, SFTConfig)
    if values.get("init_adapter"):
        values["init_adapter"] = str(Path(values["init_adapter"]).resolve())
    try:
        config = SFTConfig(**values, ray=sft_ray(args))
    except StropError as exc:
        raise StropError(str(exc).replace("invalid supervised config", "invalid flags")) from None
    run_dir = args.run_dir or runs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-sft-{safe_name(config.base_model)}"
    result = run_sft(config, run_dir, progress=not args.quiet)
    steps = [m for m in result.metrics if m["step"] >= 0]
    evals = [m["evalLoss"] for m in result.metrics if m.get("evalLoss") is not None]
    summary = {"runDir": str(result.run_dir), "steps": result.steps, "finalAdapter": str(result.final_adapter),
               "firstLoss": steps[0]["loss"] if steps else None, "lastLoss": steps[-1]["loss"] if steps else None,
               "heldOutLossBefore": evals[0] if evals else None, "heldOutLossAfter": evals[-1] if evals else None,
               "metrics": str(result.run_dir / "metrics.jsonl")}
    emit(args, summary, lambda s: format_table(steps, [("step", "STEP"), ("loss", "LOSS"), ("evalLoss", "HELD-OUT"),
                                                       ("trainedTokens", "TOKENS"), ("stepSeconds", "SECONDS")])
         + f"\n\nrun folder: {s['runDir']}\ntuned adapter: {s['finalAdapter']}")
    return 0


def sft_ray(args) -> dict | None:
    """The Ray settings --ray-address and --trainers give a supervised run (None: it trains in this process)."""
    if args.ray_address is None:
        if args.trainers is not None:
            raise StropError("--trainers places trainers on a Ray cluster: give --ray-address too")
        return None
    return {"address": args.ray_address, "trainers": 1 if args.trainers is None else args.trainers}


def _table(metrics: list[dict]) -> str:
    cols = [("step", "STEP"), ("reward", "REWARD"), ("zeroVarianceGroups", "ZERO-VAR"), ("entropy", "ENTROPY"),
            ("completionLength", "LENGTH"), ("klSampleTrain", "KL(S|T)"), ("stepSeconds", "SECONDS")]
    return format_table(metrics, cols)
