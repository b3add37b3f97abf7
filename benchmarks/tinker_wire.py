"""Seed 000's RL loop through the unmodified tinker SDK against `strop serve-tinker`, side by side with the same
loop on strop's in-process client: does it learn over the wire, and what does the wire cost?

    python benchmarks/tinker_wire.py                          # SmolLM2-135M-Instruct, arithmetic, 20 steps each
    python benchmarks/tinker_wire.py --steps 20 --eval-n 200

One loop runs both ways, written against Tinker's API (sample, forward_backward("importance_sampling"),
optim_step, save_weights_and_get_sampling_client each step): with `tinker.ServiceClient()` pointed at a
`strop serve-tinker` subprocess (TINKER_BASE_URL, TINKER_API_KEY; nothing else), and with `strop.ServiceClient()`
in this process, step by step in turn. Same prompts, seeds and sizes. Prints reward per step for each, the seconds per step and their
ratio (the wire's overhead), and the SDK run's held-out accuracy before and after with an exact McNemar test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from learning_arithmetic import add_task_flags, held_out  # noqa: E402

import strop  # noqa: E402
from strop import model_info, renderers  # noqa: E402
from strop.evals.stats import mcnemar_exact  # noqa: E402
from strop.scoring import load_grader  # noqa: E402


def ready(value):
    """The tinker SDK returns futures of clients (call .result()); strop's client returns them at once."""
    from strop.client import SamplingClient, TrainingClient
    return value if isinstance(value, (SamplingClient, TrainingClient)) else value.result()


class RLLoop:
    """Seed 000's loop, one step per call: a fresh sampling client, GROUP samples per prompt, reward, centre,
    importance_sampling, optim_step. The same code drives the tinker SDK's clients and strop's."""

    def __init__(self, service_client, types, model: str, renderer, rows, args):
        self.types, self.renderer, self.rows, self.args = types, renderer, rows, args
        self.grade = load_grader("builtin:gsm8k")
        self.training_client = ready(service_client.create_lora_training_client(base_model=model, rank=args.rank,
                                                                                seed=0))
        self.adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip_norm=1.0)

    def step(self, step: int) -> dict:
        types, args, renderer = self.types, self.args, self.renderer
        t0 = time.perf_counter()
        batch = self.rows[step * args.batch_size:(step + 1) * args.batch_size]
        sampling_client = ready(self.training_client.save_weights_and_get_sampling_client())
        prompts = [types.ModelInput.from_ints(renderer.build_generation_prompt(
            [{"role": "user", "content": row.question}]).to_ints()) for row in batch]
        futures = [sampling_client.sample(prompt=p, num_samples=args.group_size, sampling_params=types.SamplingParams(
            max_tokens=args.max_tokens, temperature=1.0, stop=renderer.get_stop_sequences(), seed=1000 * step + i))
                   for i, p in enumerate(prompts)]
        results = [future.result() for future in futures]
        t_sampled = time.perf_counter()
        datums, rewards = [], []
        for result, prompt, row in zip(results, prompts, batch):
            group = []
            for seq in result.sequences:
                message, _ = renderer.parse_response(list(seq.tokens))
                group.append(self.grade(solution_str=renderers.get_text_content(message), ground_truth=row.answer))
            mean = sum(group) / len(group)
            rewards.append(mean)
            if all(r == mean for r in group):
                continue
            ob_len = prompt.length - 1
            for seq, reward in zip(result.sequences, group):
                toks, lps = list(seq.tokens), list(seq.logprobs)
                mi = prompt.append(types.EncodedTextChunk(tokens=toks[:-1]))
                datums.append(types.Datum(model_input=mi, loss_fn_inputs={
                    "target_tokens": [0] * ob_len + toks, "logprobs": [0.0] * ob_len + lps,
                    "advantages": [0.0] * ob_len + [reward - mean] * (mi.length - ob_len)}))
        t_train = time.perf_counter()
        if datums:
            fb = self.training_client.forward_backward(datums, loss_fn="importance_sampling")
            opt = self.training_client.optim_step(self.adam)
            fb.result(), opt.result()
        done = time.perf_counter()
        return {"step": step, "reward": sum(rewards) / len(rewards), "datums": len(datums), "seconds": done - t0,
                "sample_s": t_sampled - t0, "train_s": done - t_train}

    def sampler(self):
        return ready(self.training_client.save_weights_and_get_sampling_client())


def greedy_correct(sampler, types, renderer, rows, max_tokens: int) -> list[bool]:
    grade = load_grader("builtin:gsm8k")
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=renderer.get_stop_sequences())
    futures = [sampler.sample(prompt=types.ModelInput.from_ints(renderer.build_generation_prompt(
        [{"role": "user", "content": r.question}]).to_ints()), num_samples=1, sampling_params=params) for r in rows]
    out = []
    for future, row in zip(futures, rows):
        message, _ = renderer.parse_response(list(future.result().sequences[0].tokens))
        out.append(grade(solution_str=renderers.get_text_content(message), ground_truth=row.answer) == 1.0)
    return out


def start_server(home: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`strop serve-tinker --port 0 --log-jobs --open` in a subprocess, its stderr going to `log`; (process, URL)."""
    env = {**os.environ, "STROP_HOME": str(home)}
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "strop.cli.main", "serve-tinker", "--port", "0", "--log-jobs",
                                 "--open"],
                                stderr=sink, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = log.read_text()
        if "tinker API at " in text:
            return proc, text.split("tinker API at ")[1].split()[0]
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"strop serve-tinker did not start: {log.read_text()[-2000:]}")


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_task_flags(cli)
    cli.add_argument("--out", type=Path, default=Path("benchmarks/out/tinker_wire"))
    args = cli.parse_args()
    import tinker

    from strop.data import generate
    from strop.engine.precision import kernels, resolve_dtype
    from strop.paths import strop_home
    print(f"{args.model}; trainer {resolve_dtype('auto')}; CPU kernels {kernels()}; tinker SDK {tinker.__version__}",
          flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(args.model),
                                      strop.tokenizer_utils.get_tokenizer(args.model))
    rows = list(generate(args.level, args.steps * args.batch_size, seed=7, split="train"))
    eval_rows = held_out(args.level, args.eval_n)

    proc, url = start_server(strop_home(), args.out / "server.log")
    try:
        os.environ["TINKER_BASE_URL"], os.environ["TINKER_API_KEY"] = url, "tml-benchmark"
        sdk = tinker.ServiceClient()
        base = ready(sdk.create_sampling_client(base_model=args.model))
        t0 = time.perf_counter()
        before = greedy_correct(base, tinker.types, renderer, eval_rows, args.max_tokens)
        print(f"before (through the SDK): {sum(before)}/{len(before)} ({time.perf_counter() - t0:.0f} s)", flush=True)
        # the two loops step in turn (which goes first alternates), so a machine that speeds up or slows down
        # during the run weighs on both alike
        wire_loop = RLLoop(sdk, tinker.types, args.model, renderer, rows, args)
        local_loop = RLLoop(strop.ServiceClient(), strop.types, args.model, renderer, rows, args)
        wire, local = [], []
        for step in range(args.steps):
            pair = [("wire", wire_loop, wire), ("local", local_loop, local)]
            for name, loop, history in (pair if step % 2 == 0 else pair[::-1]):
                history.append(loop.step(step))
                row = history[-1]
                print(f"  {name:5s} step {step:3d}  reward {row['reward']:.3f}  datums {row['datums']:3d}  "
                      f"{row['seconds']:5.1f} s (sample {row['sample_s']:.1f}, train {row['train_s']:.1f})", flush=True)
        tuned = wire_loop.sampler()
        t0 = time.perf_counter()
        after = greedy_correct(tuned, tinker.types, renderer, eval_rows, args.max_tokens)
        print(f"after (through the SDK): {sum(after)}/{len(after)} ({time.perf_counter() - t0:.0f} s)", flush=True)
        sdk.close("success").result()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    b = sum(x and not y for x, y in zip(before, after))
    c = sum(y and not x for x, y in zip(before, after))
    p = mcnemar_exact(b, c)
    # step 0 loads the model on each side (and the server's in another process): compare the steps after it
    wire_s, local_s = sum(r["seconds"] for r in wire[1:]), sum(r["seconds"] for r in local[1:])
    summary = {"model": args.model, "kernels": kernels(), "steps": args.steps, "eval_n": len(eval_rows),
               "acc_before": sum(before) / len(before), "acc_after": sum(after) / len(after), "mcnemar_b": b,
               "mcnemar_c": c, "p": p, "wire_seconds": wire_s, "local_seconds": local_s,
               "overhead": wire_s / local_s - 1, "wire": wire, "local": local}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"held-out accuracy through the SDK: {summary['acc_before']:.1%} -> {summary['acc_after']:.1%}; "
          f"discordant {b} right->wrong, {c} wrong->right; exact McNemar p = {p:.3g}")
    ratios = sorted(w["seconds"] / l["seconds"] for w, l in zip(wire[1:], local[1:]))
    summary["median_step_ratio"] = ratios[len(ratios) // 2] if ratios else None
    for part in ("sample_s", "train_s"):
        summary[f"wire_{part}"] = sum(r[part] for r in wire[1:])
        summary[f"local_{part}"] = sum(r[part] for r in local[1:])
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"steps 1..{args.steps - 1}: SDK over the wire {wire_s:.0f} s, in process {local_s:.0f} s; "
          f"ratio {wire_s / local_s:.3f} (overhead {summary['overhead']:+.1%}); median per-step ratio "
          f"{summary['median_step_ratio']:.3f}; sampling {summary['wire_sample_s']:.0f} s vs "
          f"{summary['local_sample_s']:.0f} s, training {summary['wire_train_s']:.0f} s vs {summary['local_train_s']:.0f} s")
    print(f"mean reward, last 4 steps: wire {sum(r['reward'] for r in wire[-4:]) / 4:.3f}, "
          f"in process {sum(r['reward'] for r in local[-4:]) / 4:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
