"""Supervised fine-tuning with LoRA: the warm start before GRPO (a model that never writes a valid tool call gives
GRPO no signal to learn from).

    from strop.sft import SFTConfig, run_sft
    result = run_sft(SFTConfig(base_model="strop/tiny-random", dataset="demos.jsonl", max_steps=20), "runs/sft")

The loop is Tinker's supervised recipe over strop's primitives: each step takes `batch_size` examples,
`forward_backward(loss_fn="cross_entropy")` with weights 1 on the assistant's tokens only, then `optim_step`.
A share of the examples (`eval_fraction`, at least one) is held out, and their loss per trained token is
measured before the first step, every `eval_every` steps and at the end. The run folder is a GRPO run's:
config.json, metrics.jsonl (loss per trained token, tokens, seconds, held-out loss), TensorBoard events,
checkpoints/ and final/ (the adapter, which GRPO can start from); running again on the same folder resumes.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from strop import model_info
from strop.client import ServiceClient
from strop.renderers import get_renderer
from strop.rl import checkpoints
from strop.rl.metrics import RunLog, read_jsonl
from strop.rl.skipped import SkippedUpdates
from strop.rl.step import adam_params, training_client
from strop.sft.config import SFTConfig
from strop.sft.data import Example, check_file, example_datum, load_examples


@dataclass(frozen=True)
class SFTResult:
    run_dir: Path
    steps: int
    final_adapter: Path
    metrics: list[dict]


def split_examples(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, held out): a seeded share held out, at least one when there are two or more examples."""
    order = list(range(len(examples)))
    random.Random(f"sft-split:{seed}").shuffle(order)
    held = max(1, round(len(examples) * fraction)) if fraction > 0 and len(examples) > 1 else 0
    return [examples[i] for i in sorted(order[held:])], [examples[i] for i in sorted(order[:held])]


def held_out_loss(training, examples: list[Example], batch_size: int) -> float | None:
    """Loss per trained token over `examples`, under the current weights (no gradient)."""
    if not examples:
        return None
    total, tokens = 0.0, 0
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        out = training.forward([example_datum(e) for e in batch], loss_fn="cross_entropy").result()
        total += out.metrics["loss:sum"]
        tokens += sum(e.trained - (e.weights[0] > 0) for e in batch)
    return total / tokens if tokens else None


def run_sft(config: SFTConfig, run_dir: str | Path, *, service: ServiceClient | None = None,
            progress: bool = True) -> SFTResult:
    run_dir = Path(run_dir)
    if service is None:
        check_file(config.dataset)  # a bad line is one error at once, before a model is loaded (a first use: minutes)
        own = ServiceClient(dtype=config.dtype, ray=config.ray, gpus=config.gpus)
        try:
            return run_sft(config, run_dir, service=own, progress=progress)
        finally:
            own.close()  # the trainers it placed on a Ray cluster end with the run
    training = training_client(service, config)
    renderer = get_renderer(config.renderer or model_info.get_recommended_renderer_name(config.base_model),
                            training.get_tokenizer())
    # every line checked before the run folder exists: a bad file leaves nothing behind
    train, held = split_examples(load_examples(config.dataset, renderer, max_seq_length=config.max_seq_length),
                                 config.eval_fraction, config.seed)
    # the trainer's micro-batch that fits this machine (smaller micro-batches, same gradients), or MemoryRefused
    # naming what to lower: planned as for GRPO with one "completion" per example, which over-counts (no sampler)
    longest = max(len(e.tokens) for e in train + held)
    memory = service.plan_grpo_memory(config.base_model, batch_size=config.batch_size, group_size=1, prompt_tokens=0,
                                      completion_tokens=longest,
                                      what=f"supervised fine-tuning of {config.base_model} ({config.batch_size} "
                                           f"examples x <= {longest} tokens)")
    training.set_micro_batch_tokens(memory["tokensPerMicroBatch"])
    per_pass = max(1, math.ceil(len(train) / config.batch_size))
    steps = config.max_steps or config.epochs * per_pass
    adam = adam_params(config)
    start = checkpoints.resume(training, run_dir)
    saved = {"method": "sft", **config.to_dict()}
    (run_dir / "config.json").write_text(json.dumps(saved, indent=2))
    (run_dir / "engine.json").write_text(json.dumps(training.engine_facts(), indent=2))
    log = RunLog(run_dir, start_step=start, report_to=config.report_to, config=saved)
    skipped = SkippedUpdates(0.5, "a supervised run's limit")
    bar = tqdm(total=steps, initial=start, desc="SFT", unit="step", file=sys.stderr, dynamic_ncols=True) \
        if progress else None
    try:
        if start == 0 and held:
            log.write_step({"step": -1, "evalLoss": held_out_loss(training, held, config.batch_size)})
        for step in range(start, steps):
            epoch, within = divmod(step, per_pass)
            order = list(range(len(train)))
            random.Random(config.seed * 1000 + epoch).shuffle(order)
            batch = [train[i] for i in order[within * config.batch_size:(within + 1) * config.batch_size]]
            t0 = time.perf_counter()
            out = training.forward_backward([example_datum(e) for e in batch], loss_fn="cross_entropy").result()
            optim = training.optim_step(adam).result().metrics
            seconds = time.perf_counter() - t0
            trained = sum(e.trained - (e.weights[0] > 0) for e in batch)
            row = {"step": step, "epoch": epoch, "loss": out.metrics["loss:sum"] / max(1, trained),
                   "trainedTokens": trained, "tokens": sum(len(e.tokens) for e in batch),
                   "tokensPerSecond": sum(len(e.tokens) for e in batch) / seconds if seconds > 0 else 0.0,
                   "stepSeconds": seconds, "gradNorm": optim.get("grad_norm"),  # None: the update was skipped
                   "updateSkipped": int(optim.get("skipped_nonfinite", 0)), "learningRate": config.learning_rate}
            last = step + 1 == steps
            if held and (last or (config.eval_every and (step + 1) % config.eval_every == 0)):
                row["evalLoss"] = held_out_loss(training, held, config.batch_size)
            log.write_step(row)
            skipped.count(step, True, row["updateSkipped"], last=last)  # a run of NaN updates fails before it saves
            if bar is not None:
                bar.set_postfix(loss=f"{row['loss']:.3f}", **({"eval": f"{row['evalLoss']:.3f}"}
                                                              if "evalLoss" in row else {}))
                bar.update(1)
            if (step + 1) % config.save_every == 0 or last:
                checkpoints.save(training, run_dir, step + 1, config.keep_adapters)
    finally:
        log.close()
        if bar is not None:
            bar.close()
    final = Path(training.save_weights(str(run_dir / "final")).result().path)
    return SFTResult(run_dir=run_dir, steps=steps, final_adapter=final, metrics=read_jsonl(run_dir / "metrics.jsonl"))
