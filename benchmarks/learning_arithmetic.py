"""Does strop's GRPO loop teach SmolLM2-135M-Instruct arithmetic on this CPU? Held-out accuracy before and
after, with an exact McNemar test on the paired outcomes.

    python benchmarks/learning_arithmetic.py                      # 20 steps x 8 prompts x 8 samples x <= 48 tokens
    python benchmarks/learning_arithmetic.py --steps 30 --level add-sub
    python benchmarks/learning_arithmetic.py --sampler vllm --sampler-dtype float32   # rollouts and evaluations by vLLM
    python benchmarks/learning_arithmetic.py --recipe dapo                        # a named recipe (issue 40's table)
    python benchmarks/learning_arithmetic.py --sampler-dtype bfloat16 --set rollout_correction=tis

The reference point (DESIGN.md): TRL GRPO on the same model and task went 29.0% -> 56.5% (p = 1e-11) in
1,366 s. Prints reward per step, then accuracies, the discordant counts and p; the last line is a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import strop
from strop import model_info, renderers, types
from strop.data import generate
from strop.evals.stats import mcnemar_exact
from strop.models import DEFAULT_MODEL
from strop.rl import GRPOConfig, run_grpo
from strop.scoring import load_grader


# The named recipes of issue 40's table: GRPOConfig fields over today's default (importance-sampling loss, token
# sum, group mean, one update per batch), each following the paper or library it is named after.
RECIPES = {
    "default": {},
    "dapo": {"loss_fn": "ppo", "loss_aggregation": "token-mean", "clip_high": 1.28, "overlong": "soft-penalty",
             "dynamic_sampling": True},                                  # DAPO, arXiv 2503.14476
    "dr-grpo": {"loss_aggregation": "constant", "scale_by_std": False},  # Dr. GRPO, arXiv 2503.20783 (normaliser:
                                                                        # max tokens, set below)
    "gspo": {"loss_fn": "ppo", "importance_ratio": "sequence", "updates_per_batch": 2},  # GSPO, arXiv 2507.18071
    "rloo": {"advantage_estimator": "rloo"},                             # RLOO, arXiv 2402.14740
    "reinforce++": {"advantage_estimator": "reinforce++"},               # REINFORCE++, arXiv 2501.03262
    "2-updates": {"loss_fn": "ppo", "updates_per_batch": 2},             # the sampled batch used twice, PPO's clip
}


def recipe_fields(name: str, max_tokens: int, extra: list[str]) -> dict:
    """The recipe's fields, then each --set FIELD=VALUE (VALUE read as JSON where it parses, else as text)."""
    fields = dict(RECIPES[name])
    if fields.get("loss_aggregation") == "constant":
        fields["loss_normalizer"] = float(max_tokens)
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: give FIELD=VALUE, e.g. rollout_correction=tis")
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value
    return fields


def held_out(level: str, n: int) -> list:
    """n distinct problems from the test half of the level's problem space."""
    seen, rows = set(), []
    for row in generate(level, 20 * n, seed=12345, split="test"):
        if row.question not in seen:
            seen.add(row.question)
            rows.append(row)
        if len(rows) == n:
            return rows
    raise SystemExit(f"level {level} has only {len(rows)} distinct held-out problems; ask for fewer with --eval-n")


def add_task_flags(cli: argparse.ArgumentParser) -> None:
    """The model, task and GRPO sizes (shared with tinker_wire.py, which runs the same task over the SDK)."""
    cli.add_argument("--model", default=DEFAULT_MODEL)
    cli.add_argument("--level", default="add")
    cli.add_argument("--steps", type=int, default=20)
    cli.add_argument("--batch-size", type=int, default=8)
    cli.add_argument("--group-size", type=int, default=8)
    cli.add_argument("--max-tokens", type=int, default=48)
    cli.add_argument("--lr", type=float, default=1e-4)
    cli.add_argument("--rank", type=int, default=32)
    cli.add_argument("--eval-n", type=int, default=200)


def greedy_correct(sampler, renderer, rows, max_tokens: int) -> list[bool]:
    grade = load_grader("builtin:gsm8k")
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0, stop=renderer.get_stop_sequences())
    futures = [sampler.sample(prompt=renderer.build_generation_prompt([{"role": "user", "content": r.question}]),
                              num_samples=1, sampling_params=params) for r in rows]
    out = []
    for future, row in zip(futures, rows):
        message, _ = renderer.parse_response(future.result().sequences[0].tokens)
        out.append(grade(solution_str=renderers.get_text_content(message), ground_truth=row.answer) == 1.0)
    return out


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_task_flags(cli)
    cli.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                     help="what training computes in, and sampling unless --sampler-dtype (default: %(default)s: "
                          "training in bfloat16 where the CPU has bf16 units, sampling in float32, as a run does)")
    cli.add_argument("--sampler-dtype", choices=("float32", "bfloat16"),
                     help="the sampler's dtype when it should differ from --dtype's")
    cli.add_argument("--sampler", default="auto", choices=("auto", "strop", "vllm"),
                     help="the engine that samples rollouts and evaluations (vllm: pip install -e \".[vllm]\" or "
                          "STROP_VLLM_PYTHON)")
    cli.add_argument("--recipe", default="default", choices=sorted(RECIPES),
                     help="the loss, advantage and update choices (issue 40's table; see RECIPES)")
    cli.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                     help="a GRPOConfig field over the recipe's, e.g. rollout_correction=tis; repeat for several")
    cli.add_argument("--out", type=Path, default=Path("benchmarks/out/learning_arithmetic"))
    args = cli.parse_args()

    from strop.engine.precision import kernels, resolve_dtype, sampler_dtype_for
    dtype = resolve_dtype(args.dtype)
    sampler_dtype = args.sampler_dtype or sampler_dtype_for(args.dtype)  # what a run at this --dtype samples in
    print(f"{args.model}, trainer {dtype}, sampler {sampler_dtype}; CPU kernels {kernels()}", flush=True)
    t_start = time.perf_counter()
    eval_rows = held_out(args.level, args.eval_n)
    service = strop.ServiceClient(dtype=dtype, sampler_dtype=sampler_dtype, sampler=args.sampler)
    print(f"sampler: {service.start_sampler(args.model)}", flush=True)
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(args.model),
                                      strop.tokenizer_utils.get_tokenizer(args.model))

    t0 = time.perf_counter()
    before = greedy_correct(service.create_sampling_client(base_model=args.model), renderer, eval_rows, args.max_tokens)
    eval_before_s = time.perf_counter() - t0
    print(f"before: {sum(before)}/{len(before)} = {sum(before) / len(before):.1%} ({eval_before_s:.0f} s)", flush=True)

    config = GRPOConfig(base_model=args.model, dataset=f"synthetic:{args.level}", max_steps=args.steps,
                        batch_size=args.batch_size, group_size=args.group_size, max_completion_length=args.max_tokens,
                        learning_rate=args.lr, lora_rank=args.rank, temperature=1.0, kl_beta=0.0,
                        save_every=args.steps, keep_adapters=1, dtype=dtype,
                        **recipe_fields(args.recipe, args.max_tokens, args.set))
    if args.out.exists():
        import shutil
        shutil.rmtree(args.out)  # a benchmark starts fresh; a resumed run would not measure training time
    t0 = time.perf_counter()
    result = run_grpo(config, args.out, service=service, progress=False)
    train_s = time.perf_counter() - t0
    for row in result.metrics:
        print(f"step {row['step']:3d}  reward {row['reward']:.3f}  zeroVarianceGroups {row['zeroVarianceGroups']:.2f}  "
              f"length {row['completionLength']:5.1f}  kl {row['klSampleTrain'] or 0:+.4f} (max {row['klSampleTrainMax'] or 0:.3f}, "
              f"outside [0.5, 2] {row['samplerRatioOutside'] or 0:.4f})  {row['stepSeconds']:5.1f} s "
              f"(sample {row['sampleSeconds']:.1f}, train {row['trainSeconds']:.1f})")

    tuned = service.create_sampling_client(base_model=args.model, model_path=str(result.final_adapter))
    t0 = time.perf_counter()
    after = greedy_correct(tuned, renderer, eval_rows, args.max_tokens)
    eval_after_s = time.perf_counter() - t0
    b = sum(x and not y for x, y in zip(before, after))   # right before, wrong after
    c = sum(y and not x for x, y in zip(before, after))   # wrong before, right after
    p = mcnemar_exact(b, c)
    acc_before, acc_after = sum(before) / len(before), sum(after) / len(after)
    total_s = time.perf_counter() - t_start
    print(f"after:  {sum(after)}/{len(after)} = {acc_after:.1%} ({eval_after_s:.0f} s)")
    print(f"discordant pairs: {b} right->wrong, {c} wrong->right; exact McNemar p = {p:.3g}")
    print(f"training {train_s:.0f} s for {args.steps} steps ({train_s / args.steps:.1f} s/step); total {total_s:.0f} s")
    summary = {"model": args.model, "dtype": dtype, "sampler_dtype": sampler_dtype, "sampler": service.backend.sampler_facts(), "recipe": args.recipe, "set": args.set, "kernels": kernels(), "level": args.level, "steps": args.steps, "eval_n": len(eval_rows),
               "acc_before": acc_before, "acc_after": acc_after, "mcnemar_b": b, "mcnemar_c": c, "p": p,
               "train_seconds": train_s, "total_seconds": total_s}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"accuracy {acc_before:.3f} -> {acc_after:.3f}  p {p:.2g}  train_s {train_s:.0f}  total_s {total_s:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
