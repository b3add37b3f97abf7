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
from strop.rl.branching import IDENTICAL_TURNS
from strop.rl.config import LOSS_FNS, GRPOConfig
from strop.rl.loss_choices import (ADVANTAGE_ESTIMATORS, FIELDS as LOSS_CHOICE_FIELDS, IMPORTANCE_RATIOS,
                                   LOSS_AGGREGATIONS, OVERLONG)
from strop.scoring.bundles import absolute_ref
from strop.trackers import DEFAULT as DEFAULT_TRACKERS, parse_report_to


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
    p.add_argument("--base-model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="catalog id, hub id, local HF directory, or strop/tiny-random (default: %(default)s)")
    p.add_argument("--dataset", default="synthetic:add",
                   help="synthetic[:LEVEL] (levels: add, add-sub, mul, mixed, word-1, word-2, word-3), gsm8k, or a "
                        ".jsonl/.json/.parquet file with question and answer fields (default: %(default)s)")
    p.add_argument("--limit", type=int, help="use only the first N rows of the dataset (or tasks of --environment)")
    p.add_argument("--environment", metavar="ENV",
                   help="train in a tool-use environment's episodes instead of on --dataset: a registered one "
                        "(finance-sql; `strop envs list`), an OpenEnv server's URL or package.module:ClassName; "
                        "rewarded by the environment, on its train split")
    p.add_argument("--env-option", action="append", metavar="KEY=VALUE",
                   help="an option of --environment (VALUE read as JSON where it parses, else as text), e.g. "
                        "seed=3; repeat for several")
    p.add_argument("--reward", action="append", metavar="REF[=WEIGHT]",
                   help="a reward term: builtin:gsm8k, builtin:gsm8k-format or DIR[#MODULE[:FUNCTION]], with an "
                        "optional weight (default 1.0); repeat for several terms (default: builtin:gsm8k)")
    p.add_argument("--steps", type=int, help="the number of steps: the rows are reshuffled each pass until N steps "
                                             "are made, --epochs notwithstanding (default: --epochs passes)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the dataset when --steps is not given "
                                                         "(default: %(default)s)")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt, at least 2 (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per step (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens per completion (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (default: %(default)s)")
    p.add_argument("--rank", type=int, default=32, help="LoRA rank (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: %(default)s)")
    p.add_argument("--kl-beta", type=float, default=0.0,
                   help="KL penalty to the reference model, --kl-reference (default: %(default)s)")
    p.add_argument("--kl-reference", choices=("start", "base"),
                   help="what --kl-beta measures drift from: start, the model the run started from (the "
                        "--init-adapter's weights; the base model without one), or base, the base model with the "
                        "adapter off (default: start)")
    p.add_argument("--variance-on", metavar="TERM",
                   help="judge a group informative by the spread of this reward term (a --reward's name, or an "
                        "environment's term such as correctness) instead of the total reward; a group with none is "
                        "dropped")
    p.add_argument("--dynamic-sampling", action="store_true",
                   help="DAPO's dynamic sampling: draw further prompts until --batch-size groups have reward "
                        "variance (or --max-tasks-per-step were drawn); metrics record tasksDrawn, groupsKept and "
                        "groupsDropped")
    p.add_argument("--max-tasks-per-step", type=int, metavar="N",
                   help="the most prompts dynamic sampling draws for a step, its batch included (default: 4 x "
                        "--batch-size)")
    p.add_argument("--warmup-steps", type=int, metavar="N",
                   help="raise the learning rate linearly over the first N steps (default: 0, no warm-up)")
    p.add_argument("--branch-at-turn", type=int, metavar="N",
                   help="tool-use environments: play each task once up to model turn N, then sample the group on "
                        "from exactly that state, so the group's mean is a baseline for turn N's decision; the "
                        "shared turns are sampled and trained once, with no advantage (1: an ordinary group; an "
                        "episode that ends sooner branches at its last turn). Needs an environment that answers the "
                        "same calls the same way (default: no branching)")
    p.add_argument("--identical-turns", choices=IDENTICAL_TURNS,
                   help="turns every episode of a group wrote alike: skip leaves them out of the update, train "
                        "trains them, auto (default) skips them where the gradient is the same either way "
                        "(--loss importance_sampling or cispo, --kl-beta 0)")
    p.add_argument("--loss", default="importance_sampling", choices=LOSS_FNS,
                   help="policy loss (default: %(default)s)")
    p.add_argument("--scale-by-std", action="store_true", help="divide advantages by the group's reward std")
    # the loss choices (strop.rl.loss_choices; docs/training.md, "Loss choices"): each off by default
    p.add_argument("--advantage-estimator", choices=ADVANTAGE_ESTIMATORS,
                   help="the baseline a reward is compared with: group-mean (GRPO, default), rloo (the group's other "
                        "samples: RLOO) or reinforce++ (group mean, then over the batch's std: REINFORCE++)")
    p.add_argument("--loss-aggregation", choices=LOSS_AGGREGATIONS,
                   help="how per-token losses add up: token-sum (default), token-mean (DAPO), sequence-mean (GRPO) "
                        "or constant (Dr. GRPO: over --loss-normalizer)")
    p.add_argument("--loss-normalizer", type=float, metavar="C",
                   help="--loss-aggregation constant divides by C (default: batch size x group size x max tokens)")
    p.add_argument("--overlong", choices=OVERLONG,
                   help="completions cut at --max-tokens: keep (default), mask (not trained) or soft-penalty "
                        "(DAPO: reward lowered by up to 1 over the last --overlong-buffer tokens)")
    p.add_argument("--overlong-buffer", type=int, metavar="N",
                   help="soft-penalty: tokens before --max-tokens where the penalty grows (default: a quarter)")
    p.add_argument("--importance-ratio", choices=IMPORTANCE_RATIOS,
                   help="token (default) or sequence (GSPO: one ratio a sequence, the geometric mean of its "
                        "tokens')")
    p.add_argument("--clip-low", type=float, help="--loss ppo or cispo: the lowest ratio kept (default: 0.8)")
    p.add_argument("--clip-high", type=float,
                   help="--loss ppo or cispo: the highest ratio kept (default: 1.2; clip-higher: e.g. 1.28)")
    p.add_argument("--updates-per-batch", type=int, metavar="N",
                   help="optimizer passes over each sampled batch (default: 1)")
    p.add_argument("--minibatches", type=int, metavar="N", help="optimizer steps a pass, each on a share of the "
                                                                 "batch (default: 1)")
    p.add_argument("--system-prompt", help="system message before each question")
    p.add_argument("--question-suffix", default="", help="text appended to each question")
    p.add_argument("--save-every", type=int, default=10, help="checkpoint every N steps (default: %(default)s)")
    p.add_argument("--keep-adapters", type=int, default=4, help="checkpoints kept (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for data order, LoRA init and sampling")
    p.add_argument("--run-dir", type=Path, help="run folder (default: $STROP_HOME/runs/<time>-<model>)")
    p.add_argument("--init-adapter", metavar="DIR",
                   help="start from this LoRA adapter folder (e.g. a supervised run's final/): its weights, rank, "
                        "alpha and target modules; --rank is then ignored")
    p.add_argument("--method", choices=("grpo", "sft"), default="grpo",
                   help="grpo (default), or sft: supervised fine-tuning on --dataset FILE.jsonl of chat transcripts "
                        "({\"messages\": [...], \"tools\": [...]}, e.g. from `strop envs demos`) or prompt/completion "
                        "pairs, the assistant's tokens only; takes --steps --epochs --batch-size --lr --rank "
                        "--save-every --keep-adapters --seed and the three flags below")
    p.add_argument("--max-seq-length", type=int, default=2048,
                   help="sft: refuse examples longer than this many tokens (default: %(default)s)")
    p.add_argument("--eval-fraction", type=float, default=0.1,
                   help="sft: share of the examples held out for the held-out loss (default: %(default)s)")
    p.add_argument("--eval-every", type=int, help="sft: held-out loss every N steps (default: first and last only)")
    p.add_argument("--rollout-correction", choices=("off", "tis"),
                   help="tis: weigh each sampled token's advantage by min(p_train / p_sampler, --rollout-correction-cap), "
                        "correcting for the sampler's and the trainer's numbers differing (default: off)")
    p.add_argument("--rollout-correction-cap", type=float, help="the largest weight tis gives a token (default: 2)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="what training and sampling compute in: auto (default) trains in bfloat16 where the hardware "
                        "has bf16 units (a CPU with AVX-512 BF16 or AMX, a CUDA GPU), float32 elsewhere, and samples in "
                        "float32 on a CPU; bfloat16 or float32 set both. LoRA weights, logprobs and losses stay "
                        "float32. STROP_DTYPE sets the default for `auto`")
    p.add_argument("--sampler", choices=("auto", "strop", "vllm"),
                   help="which engine samples the rollouts: strop (its own decoder), vllm (pip install -e \".[vllm]\", "
                        "or STROP_VLLM_PYTHON naming a Python that has it) or auto (default: vLLM on a CUDA GPU where "
                        "installed, strop's decoder elsewhere, the faster on a CPU). STROP_SAMPLER sets the default")
    p.add_argument("--ray-address", metavar="auto|HOST:PORT",
                   help="run on this Ray cluster (pip install -e \".[ray]\"): the trainer (--trainers of them) on "
                        "actors of their own, and for GRPO the sampler replicas; \"auto\": the cluster "
                        "`ray start --head` started on this machine")
    p.add_argument("--samplers", type=int, help="sampler replicas on the Ray cluster (default: 1; needs --ray-address)")
    p.add_argument("--trainers", type=int,
                   help="data-parallel trainers on the Ray cluster, a GPU each where it has enough, else CPUs "
                        "(default: 1; needs --ray-address): each takes a share of a step's datums and their "
                        "gradients are summed before every update, which stays the one trainer's update")
    p.add_argument("--max-off-policy-steps", type=int,
                   help="sample up to N steps ahead while the trainer updates, on rollouts at most N updates old "
                        "(default: 0, every step samples with the weights it trains)")
    p.add_argument("--report-to", type=parse_report_to, metavar="NAME[,NAME...]",
                   help="experiment trackers for the run's metrics, config and sample rollouts: tensorboard (the "
                        "run folder's events/), trackio, mlflow, wandb (each an extra: pip install -e "
                        "\".[trackers]\"; where each writes: strop.trackers), or none (default: tensorboard)")
    p.add_argument("--report-rollouts-every", type=int, metavar="N",
                   help="a table of the first rollouts of every Nth step to the trackers that have tables "
                        "(default: 10)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_output_flags(p)
    p.set_defaults(handler=run)


# flag -> the GRPOConfig field it sets; the flags are checked by the run config's one validator
# (GRPOConfig.problems_of, the one the run descriptor and the Python API use) before anything loads, and a
# refusal names the flag
FLAG_FIELDS = {"--base-model": "base_model", "--dataset": "dataset", "--limit": "dataset_limit", "--steps": "max_steps",
               "--epochs": "epochs", "--group-size": "group_size", "--batch-size": "batch_size",
               "--max-tokens": "max_completion_length", "--lr": "learning_rate", "--rank": "lora_rank",
               "--temperature": "temperature", "--kl-beta": "kl_beta", "--loss": "loss_fn",
               "--scale-by-std": "scale_by_std", "--system-prompt": "system_prompt",
               "--question-suffix": "question_suffix", "--save-every": "save_every",
               "--keep-adapters": "keep_adapters", "--seed": "seed", "--init-adapter": "init_adapter",
               "--dtype": "dtype", "--rollout-correction": "rollout_correction",
               "--rollout-correction-cap": "rollout_correction_cap", "--sampler": "sampler",
               "--max-off-policy-steps": "max_off_policy_steps", "--kl-reference": "kl_reference",
               "--variance-on": "variance_on", "--dynamic-sampling": "dynamic_sampling",
               "--max-tasks-per-step": "max_tasks_per_step", "--warmup-steps": "warmup_steps",
               "--branch-at-turn": "branch_at_turn", "--identical-turns": "identical_turns",
               "--report-to": "report_to", "--report-rollouts-every": "report_rollouts_every",
               **{f"--{name.replace('_', '-')}": name for name in LOSS_CHOICE_FIELDS}}
RAY_FLAGS = "--ray-address/--samplers/--trainers"


def config_values(args, rewards: list[dict]) -> dict:
    """The run config's values the flags give (a flag left out keeps the config's default)."""
    values = {field: getattr(args, flag[2:].replace("-", "_")) for flag, field in FLAG_FIELDS.items()}
    if args.environment is not None:
        values["environment"] = {"name": args.environment, "options": env_options(args.env_option or []),
                                 "split": "train"}
    elif args.env_option:
        raise StropError("--env-option sets an option of --environment: give --environment too")
    if values["init_adapter"]:  # absolute, so a resumed run finds it wherever it is started from
        values["init_adapter"] = str(Path(values["init_adapter"]).resolve())
    if args.ray_address is not None or args.samplers is not None or args.trainers is not None:
        if args.ray_address is None:
            flag = "--samplers places sampler replicas" if args.samplers is not None else "--trainers places trainers"
            raise StropError(f"{flag} on a Ray cluster: give --ray-address too")
        values["ray"] = {"address": args.ray_address, "samplers": 1 if args.samplers is None else args.samplers,
                         "trainers": 1 if args.trainers is None else args.trainers}
    return {**{k: v for k, v in values.items() if v is not None}, "reward_terms": rewards}


def flag_problems(args, rewards: list[dict]) -> list[str]:
    """'--group-size (group_size): must be an integer from 2 to 1,024 (got ...); why' for each flag out of range."""
    flags = {field: flag for flag, field in FLAG_FIELDS.items()}
    problems = []
    for name, problem in GRPOConfig.problems_of(config_values(args, rewards)):
        if name in flags:
            problems.append(f"{flags[name]} ({name}): {problem}")
        elif name == "ray":
            problems.append(f"{RAY_FLAGS}: {problem}")
        elif name == "environment":
            problems.append(f"--environment/--env-option: {problem}")
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


# flags only GRPO reads: refused with --method sft when set to anything but their default
GRPO_ONLY = ("--limit", "--reward", "--group-size", "--max-tokens", "--temperature", "--kl-beta", "--loss",
             "--scale-by-std", "--system-prompt", "--question-suffix", "--rollout-correction",
             "--rollout-correction-cap", "--sampler", "--samplers", "--max-off-policy-steps", "--kl-reference",
             "--variance-on", "--dynamic-sampling", "--max-tasks-per-step", "--warmup-steps", "--branch-at-turn",
             "--identical-turns", "--environment", "--env-option", "--report-rollouts-every",
             *(f"--{name.replace('_', '-')}" for name in LOSS_CHOICE_FIELDS))
# how a run is reported is not what it trains: a resumed run may report to other trackers than it started with
REPORTING = ("report_to", "report_rollouts_every")


def run(args) -> int:
    if args.method == "sft":
        return run_sft_command(args)
    # lazy: strop.rl.grpo pulls in torch, transformers, which importing this module does not need
    from strop.rl import run_grpo

    rewards = [parse_reward(s) for s in (args.reward or ["builtin:gsm8k"])]
    problems = flag_problems(args, rewards)
    if problems:
        raise StropError("invalid flags:\n  " + "\n  ".join(problems))
    config = GRPOConfig(**config_values(args, rewards))
    run_dir = args.run_dir or runs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe_name(args.base_model)}"
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
    from strop.sft import SFTConfig, run_sft
    defaults = build_defaults()
    given = [flag for flag in GRPO_ONLY if getattr(args, flag[2:].replace("-", "_")) != defaults[flag]]
    if given:
        raise StropError(f"{', '.join(given)}: {'a GRPO setting' if len(given) == 1 else 'GRPO settings'}, which "
                         "--method sft does not take")
    if args.dataset == defaults["--dataset"]:
        raise StropError("--method sft needs --dataset FILE.jsonl: chat transcripts ({\"messages\": [...]}, e.g. from "
                         "`strop envs demos finance-sql -o demos.jsonl`) or {\"prompt\", \"completion\"} pairs")
    try:
        config = SFTConfig(base_model=args.base_model, dataset=args.dataset, eval_fraction=args.eval_fraction,
                           epochs=args.epochs, max_steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                           lora_rank=args.rank, max_seq_length=args.max_seq_length, eval_every=args.eval_every,
                           save_every=args.save_every, keep_adapters=args.keep_adapters, seed=args.seed,
                           dtype=args.dtype, ray=sft_ray(args),
                           report_to=list(DEFAULT_TRACKERS) if args.report_to is None else args.report_to,
                           init_adapter=str(Path(args.init_adapter).resolve()) if args.init_adapter else None)
    except StropError as exc:
        raise StropError(str(exc).replace("invalid supervised config", "invalid flags")) from None
    run_dir = args.run_dir or runs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-sft-{safe_name(args.base_model)}"
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


def build_defaults() -> dict:
    """Each flag of `strop train` -> its default."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    action_of = {option: action for action in parser._subparsers._group_actions[0].choices["train"]._actions
                 for option in action.option_strings}
    return {flag: action.default for flag, action in action_of.items()}


def _table(metrics: list[dict]) -> str:
    cols = [("step", "STEP"), ("reward", "REWARD"), ("zeroVarianceGroups", "ZERO-VAR"), ("entropy", "ENTROPY"),
            ("completionLength", "LENGTH"), ("klSampleTrain", "KL(S|T)"), ("stepSeconds", "SECONDS")]
    return format_table(metrics, cols)
