"""What the GRPO benchmarks share: the flags, the prompts, the reward, and the worker processes.

Each side of a comparison (strop or TRL) runs in its own fresh Python process (`_grpo_worker.py`), driven one
step at a time by the benchmark script:

    config = bench_config(args)                      # model, prompts (token ids and text), sizes, lr, LoRA
    with Worker("strop", config) as strop_w, Worker("trl", config) as trl_w:
        strop_w.step(); trl_w.step()                 # each returns that step's seconds and memory figures

Separate processes keep the two from sharing anything that changes speed or memory: the allocator settings
strop makes at import (`strop.engine.malloc`), torch's thread pools, freed-but-kept heap, loaded modules.
The benchmark scripts import neither trl nor strop's engine themselves.

The identical configuration, in one place:
- prompts: the same chat-formatted token ids (strop's renderer builds them; TRL gets their decoded text, and its
  worker checks that its tokenizer gives back exactly the same ids);
- completions: exactly `tokens` new tokens on both sides (TRL: min_new_tokens = max_new_tokens; strop: EOS and
  stop sequences switched off in the sampler, see `_grpo_worker.force_fixed_length`);
- reward: `text_reward`, a deterministic pseudo-random score of the completion text, so every group has reward
  variance and both sides train on every completion (strop skips zero-variance groups; TRL never does);
- loss: strop's importance_sampling (token-level, summed) against TRL's dapo (token-level, divided by the
  batch's token count); on-policy with one update per batch both have the gradient of sum(A * log p) up to
  that constant, which Adam's normalisation makes irrelevant (see grpo_vs_trl.py's docstring);
- LoRA r, alpha = r, dropout 0, the same target modules; AdamW lr, betas (0.9, 0.95), eps 1e-8, no weight
  decay, gradient norm clipped at 1, constant learning rate; beta (KL) 0; advantages centred, not std-scaled;
  temperature 1, top_p 1, no top_k; fp32 on CPU, or both in bf16 with --dtype bfloat16.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_MODEL = "strop/tiny-random"
# DESIGN.md's TRL reference: 8 prompts x 4 samples x 64 tokens, LoRA r32, lr 1e-4, beta 0
DEFAULTS = {"model": DEFAULT_MODEL, "steps": 5, "prompts": 8, "group_size": 4, "tokens": 64}
QUICK = {"model": TINY_MODEL, "steps": 2, "prompts": 2, "group_size": 2, "tokens": 8}
VENV_HINT = ("python3 -m venv /work/bench-venv && /work/bench-venv/bin/pip install -e /work/main 'trl>=1.0'\n"
             "then run the benchmark with /work/bench-venv/bin/python benchmarks/<name>.py")


def add_size_flags(cli: argparse.ArgumentParser, steps_help: str, steps: int = DEFAULTS["steps"]) -> None:
    """--model --steps --prompts --group-size --tokens --quick; the defaults are DESIGN.md's TRL reference."""
    cli.add_argument("--model", help=f"base model (default {DEFAULT_MODEL}; --quick: {TINY_MODEL})")
    cli.add_argument("--steps", type=int, help=f"{steps_help} (default {steps}; --quick: {QUICK['steps']})")
    cli.set_defaults(full_steps=steps)
    cli.add_argument("--prompts", type=int, help=f"prompts per step (default {DEFAULTS['prompts']})")
    cli.add_argument("--group-size", type=int, help=f"samples per prompt (default {DEFAULTS['group_size']})")
    cli.add_argument("--tokens", type=int, help=f"new tokens per completion, forced (default {DEFAULTS['tokens']})")
    cli.add_argument("--quick", action="store_true",
                     help="a smoke configuration: tiny-random model, 2 prompts x 2 samples x 8 tokens, 2 steps "
                          "(any size flag given still wins)")


def resolve_sizes(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the size flags left unset from --quick's or the full defaults."""
    base = QUICK if args.quick else {**DEFAULTS, "steps": args.full_steps}
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("steps", "prompts", "group_size", "tokens"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    if args.group_size < 2:
        raise SystemExit(f"--group-size must be at least 2 (GRPO compares samples of one prompt), "
                         f"got {args.group_size}")
    return args


def add_training_flags(cli: argparse.ArgumentParser) -> None:
    cli.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate, both sides (default 1e-4)")
    cli.add_argument("--rank", type=int, default=32, help="LoRA rank, both sides; alpha = rank (default 32)")
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                     help="what both sides compute in (default float32). bfloat16: strop's base weights in bf16 with "
                          "float32 LoRA weights and logprob arithmetic; TRL's model loaded in bf16 with bf16=True "
                          "(its mixed precision), the recipe TRL's docs give")
    cli.add_argument("--trl-gradient-checkpointing", action="store_true",
                     help="let TRL recompute activations in backward (its own default; strop does not, so the "
                          "like-for-like default here is off)")
    cli.add_argument("--trl-keep-freed-memory", action="store_true",
                     help="give the TRL process the allocator settings strop makes at import (mallopt: keep freed "
                          "memory instead of returning it to the kernel); off: TRL as a TRL user runs it")
    cli.add_argument("--verbose", action="store_true", help="show the workers' own output (warnings, TRL logs)")


def require_trl() -> None:
    """Stop with the install command when trl is not importable in this Python."""
    import importlib.util
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(f"trl is not installed in this Python ({sys.executable}); the TRL side needs it. Make the "
                         f"benchmark venv (the project's own venv stays without trl):\n  {VENV_HINT}")


def questions(n: int, seed: int) -> list[str]:
    """n distinct "What is a + b?" questions (strop's synthetic `add` level): the task of DESIGN.md's reference."""
    from strop.data import generate
    seen: list[str] = []
    for row in generate("add", 50 * n, seed=seed, split="train"):
        if row.question not in seen:
            seen.append(row.question)
        if len(seen) == n:
            return seen
    raise SystemExit(f"the add level has only {len(seen)} distinct questions; ask for fewer --prompts")


def chat_prompts(model: str, qs: list[str]) -> tuple[list[list[int]], list[str]]:
    """The chat-formatted prompt of each question as strop's renderer builds it: token ids and their text."""
    from strop import model_info, renderers
    from strop.tokenizer_utils import get_tokenizer
    tokenizer = get_tokenizer(model)
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(model), tokenizer)
    ids = [renderer.build_generation_prompt([{"role": "user", "content": q}]).to_ints() for q in qs]
    return ids, [tokenizer.decode(x, skip_special_tokens=False) for x in ids]


def text_reward(text: str) -> float:
    """A deterministic pseudo-random score in [0, 1) of a completion's text.

    Not a task reward: a benchmark wants every group to carry reward variance, so that both trainers do the same
    work (strop skips groups whose rewards are all equal, TRL trains on them with zero advantage). Distinct texts
    almost surely score differently."""
    return (zlib.crc32(text.encode("utf-8")) % 1000) / 1000


def bench_config(args: argparse.Namespace) -> dict:
    """Everything a worker needs, as JSON: both sides read the same dict."""
    from strop.models import resolve_model
    qs = questions(args.prompts, args.seed)
    ids, texts = chat_prompts(args.model, qs)
    return {"model": args.model, "model_dir": str(resolve_model(args.model)), "questions": qs,
            "prompt_ids": ids, "prompt_texts": texts, "group_size": args.group_size, "tokens": args.tokens,
            "lr": args.lr, "rank": args.rank, "seed": args.seed, "dtype": args.dtype,
            # strop's default LoRA targets (strop.engine.trainer.DEFAULT_TARGETS), given to both sides explicitly
            "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            "total_steps": args.steps + 1,  # + the warm-up step
            "trl_gradient_checkpointing": args.trl_gradient_checkpointing,
            "trl_keep_freed_memory": args.trl_keep_freed_memory}


class Worker:
    """One side of a comparison in a fresh process; `step()` runs one GRPO step there and returns its figures.

    Commands go to the worker's stdin, one word a line (step, stats, quit); answers come back as JSON lines on a
    pipe of their own, so whatever the libraries print cannot be mistaken for an answer."""

    def __init__(self, side: str, config: dict, verbose: bool = False):
        self.side = side
        self.scratch = tempfile.mkdtemp(prefix=f"bench-{side}-")  # the trainer's run folder; removed on close
        read_fd, write_fd = os.pipe()
        env = {**os.environ, "BENCH_REPLY_FD": str(write_fd), "BENCH_SCRATCH": self.scratch,
               "TOKENIZERS_PARALLELISM": "false"}
        quiet = None if verbose else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-u", str(HERE / "_grpo_worker.py"), side],
                                     stdin=subprocess.PIPE, stdout=quiet, stderr=quiet, env=env,
                                     pass_fds=(write_fd,), text=True)
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")
        try:
            self._send(json.dumps(config))
            self.ready = self._answer("ready")
        except BaseException:
            self.close()
            raise

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _answer(self, kind: str) -> dict:
        line = self.replies.readline()
        if not line:
            code = self.proc.wait()
            raise SystemExit(f"the {self.side} worker exited (status {code}) before answering '{kind}'; "
                             "rerun with --verbose to see its output")
        reply = json.loads(line)
        if reply.get("kind") == "error":
            raise SystemExit(f"the {self.side} worker failed: {reply['message']}")
        return reply

    def step(self) -> dict:
        self._send("step")
        return self._answer("step")

    def stats(self) -> dict:
        self._send("stats")
        return self._answer("stats")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send("quit")
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.replies.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- memory of this process (used inside the workers) ----------------------------------------------------
def proc_status_kb(field: str) -> int | None:
    """A `/proc/self/status` figure in kB (VmRSS, VmHWM), or None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Make VmHWM start again from the current RSS (Linux: write 5 to /proc/self/clear_refs); False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_now() -> dict:
    import resource
    return {"rss_kb": proc_status_kb("VmRSS"), "hwm_kb": proc_status_kb("VmHWM"),
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def gb(kb: int | None) -> float:
    """kB (as /proc and ru_maxrss count, 1024 bytes) to GB (10^9 bytes)."""
    return float("nan") if kb is None else kb * 1024 / 1e9


def load_line() -> str:
    """The machine's cores and load: timings taken while other work holds the cores are not comparable (torch's
    threads wait at every barrier for a thread the kernel has put aside; tiny models suffer most)."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.2f} (1 min) {five:.2f} (5 min)"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def now() -> float:
    return time.perf_counter()


def count(text: str) -> int:
    """A whole number from 1 to 100,000, for argparse: sizes of 0 or less measure nothing."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 100000, got {value}")
    return value
