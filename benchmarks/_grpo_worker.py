"""One side of a GRPO comparison (strop or TRL) in its own process, one step per command.

Started by `_common.Worker`, not by hand: it reads the benchmark's JSON config as the first line of stdin, builds
its trainer, answers `ready`, then runs one GRPO step for each `step` line, reports memory for `stats` and
exits on `quit`. Answers are JSON lines written to the pipe named by BENCH_REPLY_FD.

Both sides time the same thing: from the moment the command arrives to the end of the optimizer step
(sampling, reward, advantages, forward/backward, AdamW step, the trainer's own logging).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from _common import memory_now, now, reset_peak_rss, text_reward


class Channel:
    def __init__(self):
        self.out = os.fdopen(int(os.environ["BENCH_REPLY_FD"]), "w")

    def send(self, kind: str, **fields) -> None:
        self.out.write(json.dumps({"kind": kind, **fields}) + "\n")
        self.out.flush()

    def next_command(self) -> str:
        """Wait for the next `step` (or `quit`, which ends the process), answering `stats` meanwhile."""
        while True:
            command = sys.stdin.readline().strip() or "quit"  # the parent gone: stop
            if command == "stats":
                self.send("stats", **memory_now())
            elif command in ("step", "quit"):
                if command == "quit":
                    self.out.close()
                    os._exit(0)  # skip interpreter teardown (and TRL's end-of-training work): nothing is left to do
                return command
            else:
                self.send("error", message=f"unknown command {command!r}")


def ready(channel: Channel, setup_seconds: float, **info) -> None:
    """Report setup, then restart the peak-RSS count so the steps' own peak can be read later."""
    setup = memory_now()
    channel.send("ready", setup_seconds=setup_seconds, setup_memory=setup, peak_reset=reset_peak_rss(), **info)


# ---- strop ---------------------------------------------------------------------------------------------------
class NoStopRenderer:
    """The renderer with an empty stop list: `train_step` stops sampling where the renderer says, and a
    benchmark wants every completion to run to max_tokens."""

    def __init__(self, renderer):
        self._renderer = renderer

    def get_stop_sequences(self) -> list:
        return []

    def __getattr__(self, name):
        return getattr(self._renderer, name)


def force_fixed_length(service, model: str, renderer) -> NoStopRenderer:
    """Benchmark-only: every completion is exactly max_tokens long.

    strop's sampler always adds the model's EOS ids to a request's stop set (`SamplerEngine._split_stops`) and
    `SamplingParams` has no switch to turn that off, so we empty the engine's EOS set here, and hand
    `train_step` a renderer whose stop list is empty. (A `SamplingParams.min_tokens` or `ignore_eos`, as vLLM
    has, would make this a documented option.)"""
    service.backend.queue(model).engine.eos_ids = frozenset()
    return NoStopRenderer(renderer)


def run_strop(config: dict, channel: Channel) -> None:
    t0 = now()
    import torch

    import strop
    from strop import model_info
    from strop.data import Row
    from strop.renderers import get_renderer
    from strop.rl.config import GRPOConfig
    from strop.rl.episodes import ProblemSource
    from strop.rl.grpo import build_prompt, plan
    from strop.rl.metrics import RunLog
    from strop.rl.step import StepContext, adam_params, train_step
    from strop.scoring.terms import RewardTerm

    def reward(data_source=None, solution_str=None, ground_truth=None, extra_info=None) -> float:
        return text_reward(solution_str)

    model = config["model"]
    grpo = GRPOConfig(base_model=model, dataset="synthetic:add", batch_size=len(config["questions"]),
                      group_size=config["group_size"], max_completion_length=config["tokens"],
                      learning_rate=config["lr"], lora_rank=config["rank"], lora_alpha=config["rank"],
                      lora_target_modules=config["targets"], temperature=1.0, top_p=1.0, kl_beta=0.0,
                      scale_by_std=False, loss_fn="importance_sampling", weight_decay=0.0, grad_clip_norm=1.0,
                      seed=config["seed"], dtype=config.get("dtype", "float32"))
    service = strop.ServiceClient(dtype=grpo.dtype)
    training = service.create_lora_training_client(base_model=model, rank=grpo.lora_rank, alpha=grpo.lora_alpha,
                                                   seed=grpo.seed, target_modules=grpo.lora_target_modules)
    renderer = get_renderer(model_info.get_recommended_renderer_name(model), training.get_tokenizer())
    rows = [Row(question=q, answer="0") for q in config["questions"]]
    if [build_prompt(renderer, row, grpo).to_ints() for row in rows] != config["prompt_ids"]:
        raise RuntimeError("strop's prompts differ from the benchmark's prompt_ids")
    # what run_grpo does before its first step: the micro-batch that fits this machine
    training.set_micro_batch_tokens(plan(grpo, renderer, rows, service=service)["tokensPerMicroBatch"])
    renderer = force_fixed_length(service, model, renderer)
    terms = [RewardTerm(name="text_reward", weight=1.0, fn=reward)]
    ctx = StepContext(config=grpo, training=training, renderer=renderer, source=ProblemSource(terms),
                      adam=adam_params(grpo), log=RunLog(os.environ["BENCH_SCRATCH"]))
    ready(channel, now() - t0, torch_threads=torch.get_num_threads(),
          micro_batch_tokens=training.trainer.max_tokens_per_batch)

    step = 0
    while channel.next_command() == "step":
        t0 = now()
        row = train_step(ctx, step, rows).as_row()
        seconds = now() - t0
        channel.send("step", seconds=seconds, sample_seconds=row["sampleSeconds"], train_seconds=row["trainSeconds"],
                     mean_length=row["completionLength"], all_full_length=row["clippedFraction"] == 1.0,
                     trained=row["datums"], memory=memory_now())
        step += 1


# ---- TRL -----------------------------------------------------------------------------------------------------
def run_trl(config: dict, channel: Channel) -> None:
    t0 = now()
    if config["trl_keep_freed_memory"]:
        from strop.engine.malloc import keep_freed_memory
        keep_freed_memory()
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(config["model_dir"])
    if tokenizer.pad_token is None:  # as strop's loader does
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    # TRL tokenizes text prompts with processing_class(text=...): check that gives strop's ids back
    prompts_identical = tokenizer(text=config["prompt_texts"])["input_ids"] == config["prompt_ids"]
    bf16 = config.get("dtype") == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(config["model_dir"], dtype=torch.bfloat16 if bf16 else torch.float32)

    def text_reward_fn(completions, **kwargs) -> list[float]:
        return [text_reward(c) for c in completions]

    n = config["tokens"]
    args = GRPOConfig(
        output_dir=os.environ["BENCH_SCRATCH"], report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=True, bf16=bf16, fp16=False,
        gradient_checkpointing=config["trl_gradient_checkpointing"],
        max_steps=config["total_steps"], seed=config["seed"],
        per_device_train_batch_size=len(config["prompt_texts"]) * config["group_size"],
        gradient_accumulation_steps=1, num_generations=config["group_size"], num_iterations=1,
        max_completion_length=n, generation_kwargs={"min_new_tokens": n},  # exactly n new tokens: EOS masked until n
        temperature=1.0, top_p=1.0, top_k=0, loss_type="dapo", beta=0.0, scale_rewards="none",
        mask_truncated_completions=False,
        learning_rate=config["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, max_grad_norm=1.0)
    lora = LoraConfig(r=config["rank"], lora_alpha=config["rank"], target_modules=config["targets"],
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")

    class Stepper(TrainerCallback):
        """Holds the trainer between steps until the benchmark asks for the next one."""

        def __init__(self):
            self.start, self.generate_seconds = 0.0, []

        def on_train_begin(self, args, state, control, **kwargs):
            channel.next_command()
            self.start = now()

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "train_runtime" in logs:  # the end-of-training summary, not a step
                return
            seconds = now() - self.start
            channel.send("step", seconds=seconds, generate_seconds=sum(self.generate_seconds),
                         mean_length=logs.get("completions/mean_length"),
                         all_full_length=logs.get("completions/min_length") == n == logs.get("completions/max_length"),
                         memory=memory_now())
            self.generate_seconds = []
            if state.global_step < state.max_steps:
                channel.next_command()
                self.start = now()

    stepper = Stepper()
    trainer = GRPOTrainer(model=model, reward_funcs=[text_reward_fn], args=args,
                          train_dataset=Dataset.from_dict({"prompt": config["prompt_texts"]}),
                          processing_class=tokenizer, peft_config=lora, callbacks=[stepper])
    generate = trainer._generate_single_turn

    def timed_generate(*a, **k):  # only to report how much of TRL's step is generation
        t = now()
        try:
            return generate(*a, **k)
        finally:
            stepper.generate_seconds.append(now() - t)
    trainer._generate_single_turn = timed_generate
    ready(channel, now() - t0, torch_threads=torch.get_num_threads(), trl_version=trl.__version__,
          prompts_identical=prompts_identical)
    trainer.train()
    while True:
        channel.next_command()  # more steps than max_steps were asked for: there are none
        channel.send("error", message=f"TRL was built for {config['total_steps']} steps")


def main() -> int:
    side = sys.argv[1]
    channel = Channel()
    config = json.loads(sys.stdin.readline())
    try:
        {"strop": run_strop, "trl": run_trl}[side](config, channel)
    except Exception as exc:
        traceback.print_exc()
        channel.send("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
