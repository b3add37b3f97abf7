"""The GRPO loop: a run folder, its steps, its checkpoints.

    from strop.rl import GRPOConfig, run_grpo
    result = run_grpo(GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", max_steps=2), "runs/demo")

Each step takes `batch_size` rows (or an environment's tasks) and runs `strop.rl.step.train_step`: roll out
`group_size` episodes of each, score them, centre the rewards within each group, train on the sampled tokens.
Before the first step the run is planned (`plan`: its memory, through the client) and its prompts checked, so
bad input fails before the run folder exists.

With `config.ray` the trainer, the sampler replicas (and environment or grader workers) run on a Ray cluster
(`strop.cluster`), this process driving them; with `config.max_off_policy_steps` k > 0 the next k steps sample
while this one trains (`strop.rl.ahead`).

A run folder holds config.json, metrics.jsonl, rollouts.jsonl, events/ (TensorBoard), checkpoints/ and
final/ (the tuned adapter). Calling run_grpo again on the same folder resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import math
import random
import sys
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from strop import model_info, types
from strop.choices import POLICY_LOSSES
from strop.client import SAMPLE_AS_TRAINER, ServiceClient, release_freed_memory, require_vllm
from strop.cluster.settings import RaySettings
from strop.data import Row, load_rows
from strop.errors import StropError
from strop.renderers import get_renderer
from strop.rl import checkpoints
from strop.rl.config import GRPOConfig, count_steps
from strop.rl.episodes import EnvironmentSource, EnvPool, ProblemSource, problem_messages
from strop.rl.metrics import RunLog, read_jsonl
from strop.rl.ahead import SampleAhead
from strop.rl.skipped import SkippedUpdates
from strop.rl import task_pool
from strop.rl.dynamic_sampling import TaskDraws
from strop.rl.reference import reference_sampler
from strop.rl.sft_mix import SFTMix
from strop.rl.step import StepContext, adam_params, learn_step, train_step, training_client
from strop.scoring import terms_from_spec
from strop.scoring.sandbox import SandboxPool


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    steps: int
    final_adapter: Path
    metrics: list[dict]


def build_prompt(renderer, row: Row, config: GRPOConfig) -> types.ModelInput:
    """The prompt a dataset row's episodes start from (what `ProblemEpisode` renders)."""
    return renderer.build_generation_prompt(problem_messages(row, config.system_prompt, config.question_suffix))


def check_prompt_lengths(renderer, rows: list[Row], config: GRPOConfig) -> None:
    """Refuse, before anything runs, a dataset whose prompts leave no room for a completion."""
    limit = config.max_seq_length - config.max_completion_length
    lengths = [build_prompt(renderer, row, config).length for row in rows]
    if max(lengths) > limit:
        raise StropError(f"a prompt has {max(lengths)} tokens, over max_seq_length - max_completion_length = {limit}; "
                         "raise max_seq_length, lower max_completion_length or shorten the system prompt")


def longest_prompt(renderer, items: list, config: GRPOConfig, env=None) -> int:
    """Tokens of the longest prompt a step can sample from: a dataset's longest (of its first 2,000 rows), or
    an environment's first prompt plus, for each later turn, a reply and an observation (a late turn reads
    every earlier one)."""
    if env is None:
        return max(build_prompt(renderer, row, config).length for row in items[:2000])
    first = renderer.build_tool_prompt([{"role": "user", "content": items[0].prompt}], env.tools()).length
    return first + (env.max_turns - 1) * (config.max_completion_length + 200)


def plan(config: GRPOConfig, renderer, items: list, *, env=None, service: ServiceClient | None = None) -> dict:
    """The run's memory plan, asked of the client (admission and the loop both call this): the estimate at the
    largest trainer micro-batch that fits (`tokensPerMicroBatch`), or MemoryRefused, naming what to lower, when
    the run would not fit in the memory available."""
    longest = longest_prompt(renderer, items, config, env)
    return (service or ServiceClient()).plan_grpo_memory(
        config.base_model, batch_size=config.batch_size, group_size=config.group_size, prompt_tokens=longest,
        completion_tokens=config.max_completion_length,
        what=f"GRPO on {config.base_model} ({config.batch_size} prompts x {config.group_size} samples x <= "
             f"{longest} + {config.max_completion_length} tokens)")


class StepBatches:
    """Row indices of each step: each pass a fresh seeded shuffle of the rows, cut into batches (a pass's last
    batch may be short). Made one pass at a time, so a long run holds one shuffle, not all of them."""

    def __init__(self, n_rows: int, config: GRPOConfig):
        self.n_rows, self.batch_size, self.seed = n_rows, config.batch_size, config.seed
        self.per_pass = max(1, math.ceil(n_rows / config.batch_size))
        self.steps, self.passes = count_steps(n_rows, config)
        self._pass, self._order = None, []

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> list[int]:
        if not 0 <= step < self.steps:
            raise IndexError(step)
        index, within = divmod(step, self.per_pass)
        if index != self._pass:
            self._order = list(range(self.n_rows))
            random.Random(self.seed * 1000 + index).shuffle(self._order)
            self._pass = index
        return self._order[within * self.batch_size:(within + 1) * self.batch_size]

    def pass_of(self, step: int) -> int:
        return step // self.per_pass


def run_grpo(config: GRPOConfig, run_dir: str | Path, *, service: ServiceClient | None = None,
             progress: bool = True, rows: list[Row] | None = None, announce: bool = False, on_eval=None) -> RunResult:
    """Train, writing into `run_dir` (whoever watches the run reads its files: metrics.jsonl after each step,
    checkpoints/*/manifest.json after each checkpoint). With `config.eval_every`, `on_eval(steps_done,
    training_client, renderer)` runs every that many steps, before the last one (whoever runs the loop
    evaluates the final model). `announce` prints the run folder to stderr once it exists (and the step a
    resumed run starts at)."""
    run_dir = Path(run_dir)
    if service is None:  # before a model loads: the sampler starts only after it did
        require_vllm(config.sampler, config.ray)
    with ExitStack() as stack:  # whatever was started is closed, in reverse, however the run ends
        sandbox = _grader_sandbox(config, run_dir)
        if sandbox is not None:
            stack.callback(sandbox.close)
        # everything that can fail on bad input happens before the run folder exists: nothing half-written
        pool = None
        if config.environment:
            pool = EnvPool(config.environment, config.batch_size * config.group_size,
                           ray=RaySettings.from_spec(config.ray))
            stack.callback(pool.close)
            items, config = _environment_tasks(pool, config)
        else:
            items = rows if rows is not None else load_rows(config.dataset, split="train",
                                                            limit=config.dataset_limit, seed=config.seed)
        if not items:
            raise StropError(f"dataset {config.dataset!r} has no rows to train on")
        SFTMix.check(config)
        if service is None:
            # the run's rollouts sample in what its trainer computes in (bf16 where the hardware has bf16 units,
            # corrected by tis: rollout_correction "auto"); its evaluations sample in float32 on a CPU
            service = ServiceClient(dtype=config.dtype, sampler_dtype=SAMPLE_AS_TRAINER, sampler=config.sampler,
                                    ray=config.ray,
                                    sampler_options={"log_dir": str(run_dir)},  # a vLLM engine logs into the run
                                    gpus=config.gpus)
            stack.callback(service.close)  # a vLLM engine's process ends with the run
        # the reward terms first: a grader that does not exist is one error in a second, before the base model is
        # loaded (a first use of SmolLM2 converts it: most of a minute)
        if pool is not None:
            source = EnvironmentSource(pool, system_prompt=config.system_prompt)
        else:
            source = ProblemSource(terms_from_spec(config.reward_terms, sandbox=sandbox),
                                   system_prompt=config.system_prompt, question_suffix=config.question_suffix)
        training = training_client(service, config)
        declared = config  # config.json keeps "auto" (a resume or a rerun compares against it); the run uses its choice
        config = replace(config, rollout_correction=rollout_correction(config, service.backend.sampler_dtype))
        renderer = get_renderer(config.renderer or model_info.get_recommended_renderer_name(config.base_model),
                                training.get_tokenizer())
        if pool is None and config.max_seq_length:
            check_prompt_lengths(renderer, items, config)
        mix = SFTMix.load(config, renderer)  # a bad transcript file: refused before the run folder is written
        memory = plan(config, renderer, items, env=pool.first if pool is not None else None, service=service)
        training.set_micro_batch_tokens(memory["tokensPerMicroBatch"])
        base_sampler = reference_sampler(service, config)  # the KL reference, read before a resume loads a checkpoint

        start_step = checkpoints.resume(training, run_dir)
        declared.save(run_dir / "config.json")
        service.start_sampler(config.base_model)  # a vLLM, or a Ray cluster, that is missing fails the run here
        if pool is not None:
            pool.fill()  # environment workers too
        facts = {**training.engine_facts(), "rolloutCorrection": config.rollout_correction,
                 **(pool.facts() if pool is not None else {}),
                 **getattr(sandbox, "facts", {})}
        (run_dir / "engine.json").write_text(json.dumps(facts, indent=2))
        if announce:
            print(f"run folder: {run_dir}" + (f" (resuming at step {start_step})" if start_step else ""),
                  file=sys.stderr)
        batches = StepBatches(len(items), config)
        ctx = StepContext(config=config, training=training, renderer=renderer, source=source,
                          adam=adam_params(config), base_sampler=base_sampler,
                          log=RunLog(run_dir, start_step=start_step, report_to=config.report_to,
                                     config=config.to_dict(), rollouts_every=config.report_rollouts_every),
                          draw=TaskDraws(items, config.seed) if config.dynamic_sampling else None, mix=mix)
        _steps(ctx, items, batches, start_step, run_dir, progress=progress, on_eval=on_eval)
        final = Path(training.save_weights(str(run_dir / "final")).result().path)
    return RunResult(run_dir=run_dir, steps=len(batches), final_adapter=final,
                     metrics=read_jsonl(run_dir / "metrics.jsonl"))


def rollout_correction(config: GRPOConfig, sampler_dtype) -> str:
    """"tis" or "off": the config's choice, with "auto" taking tis where the rollouts are sampled in bf16 (on the
    arithmetic benchmark bf16 rollouts learned as float32 ones did with tis, and lost 17-20 points without it:
    strop.engine.precision.sampler_dtype_for) and where the loss is one tis corrects."""
    if config.rollout_correction != "auto":
        return config.rollout_correction
    low = str(sampler_dtype).removeprefix("torch.") not in ("float32", "float64")
    return "tis" if low and config.loss_fn in POLICY_LOSSES else "off"


def _environment_tasks(pool: EnvPool, config: GRPOConfig) -> tuple[list, GRPOConfig]:
    """The environment's tasks the run draws from: its split's, or those its "tasks" pool names (read once: the
    config the run saves holds the ids, so a resume draws from the same tasks), then the first dataset_limit."""
    env = config.environment
    split = env.get("split", "train")
    if env.get("tasks") is None:
        return pool.tasks(split, config.dataset_limit), config
    ids = task_pool.pool_ids(env["tasks"])
    chosen = task_pool.select(pool.tasks(split), ids, where=f"{pool.name}'s {split!r} split with these options")
    return chosen[:config.dataset_limit], replace(config, environment={**env, "tasks": ids})


def _grader_sandbox(config: GRPOConfig, run_dir: Path):
    """Where bundle graders run: confined worker processes here, on Ray's environment workers for a dataset run
    on a cluster that has them, or nowhere (built-in graders only, or sandboxing off)."""
    if not config.sandbox_graders or all(str(t.get("grader", "")).startswith("builtin:") for t in config.reward_terms):
        return None
    ray = RaySettings.from_spec(config.ray)
    if ray is not None and ray.env_workers and not config.environment:  # a dataset's environment: its graders
        from strop.cluster.graders import GraderWorkers  # lazy: Ray is an extra
        return GraderWorkers(ray, timeout=config.grader_timeout, memory_mb=config.grader_memory_mb, hide=[run_dir])
    return SandboxPool(timeout=config.grader_timeout, memory_mb=config.grader_memory_mb, hide=[run_dir])


def _steps(ctx: StepContext, items: list, batches: StepBatches, start_step: int, run_dir: Path, *, progress: bool,
           on_eval) -> None:
    """The steps from `start_step` on: each logged, counted for skipped updates, evaluated and checkpointed when
    due; the log (and its trackers), the progress bar and any sampling ahead closed however they end."""
    config, training, log = ctx.config, ctx.training, ctx.log
    bar = _progress(len(batches), start_step, progress)
    skipped = SkippedUpdates(config.max_reward_error_fraction)
    ahead = None
    if config.max_off_policy_steps:
        ahead = SampleAhead(ctx, lambda step: [items[i] for i in batches[step]], len(batches),
                            config.max_off_policy_steps)
    try:
        for step in range(start_step, len(batches)):
            if ahead is None:
                row = train_step(ctx, step, [items[i] for i in batches[step]], batches.pass_of(step)).as_row()
            else:
                sampled, waited = ahead.take(step)
                row = learn_step(ctx, sampled, batches.pass_of(step), waited).as_row()
            log.write_step(row)
            release_freed_memory()  # what this step's passes freed does not pile up over the run (residentMiB)
            # a run whose updates were mostly NaN fails here, before its checkpoint
            skipped.count(step, row["datums"] > 0, row["updateSkipped"], last=step + 1 == len(batches))
            if bar is not None:
                bar.set_postfix(reward=f"{row['reward']:.3f}", zvg=f"{row['zeroVarianceGroups']:.2f}",
                                len=f"{row['completionLength']:.0f}", s=f"{row['stepSeconds']:.1f}")
                bar.update(1)
            if on_eval is not None and config.eval_every and (step + 1) % config.eval_every == 0 \
                    and step + 1 < len(batches):
                on_eval(step + 1, training, ctx.renderer)
            if (step + 1) % config.save_every == 0 or step + 1 == len(batches):
                checkpoints.save(training, run_dir, step + 1, config.keep_adapters)
    finally:
        if ahead is not None:
            ahead.close()
        log.close()
        if bar is not None:
            bar.close()


def _progress(total: int, start: int, enabled: bool):
    if not enabled:
        return None
    return tqdm(total=total, initial=start, desc="GRPO", unit="step", file=sys.stderr, dynamic_ncols=True)
