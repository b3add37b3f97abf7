"""The GRPO loop, top to bottom: sample -> score -> centre -> build datums -> step.

    from strop.rl import GRPOConfig, run_grpo
    result = run_grpo(GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", max_steps=2), "runs/demo")

Each step takes `batch_size` rows, samples `group_size` completions per prompt from the current weights,
scores them with the weighted reward terms, and gives each completion the advantage (reward - group mean).
Groups whose completions all scored the same carry no signal and are skipped. The surviving completions
become datums for `forward_backward` (only completion tokens carry advantages), then `optim_step`.

A run folder holds config.json, metrics.jsonl, rollouts.jsonl, events/ (TensorBoard), checkpoints/ and
final/ (the tuned adapter). Calling run_grpo again on the same folder resumes from its last checkpoint.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from strop import types
from strop.client import ServiceClient
from strop.data import Row, load_rows
from strop.errors import StropError
from strop.renderers import get_renderer, get_text_content
from strop.rl import checkpoints
from strop.rl.config import GRPOConfig, count_steps
from strop.rl.advantages import group_advantages, is_zero_variance
from strop.rl.metrics import RunLog, read_jsonl
from strop.models import resolve_model
from strop.scoring import score_terms, terms_from_spec


@dataclass(frozen=True)
class Completion:
    """One sampled completion with its scores."""

    tokens: list[int]
    logprobs: list[float]
    text: str
    stop_reason: str
    term_scores: dict[str, float]
    reward: float
    errors: list[str]


@dataclass(frozen=True)
class Group:
    """The completions of one prompt."""

    row: Row
    prompt: types.ModelInput
    completions: list[Completion]


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    steps: int
    final_adapter: Path
    metrics: list[dict]


def build_prompt(renderer, row: Row, config: GRPOConfig) -> types.ModelInput:
    messages = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
    messages.append({"role": "user", "content": row.question + config.question_suffix})
    return renderer.build_generation_prompt(messages)


def check_prompt_lengths(renderer, rows: list[Row], config: GRPOConfig) -> None:
    """Refuse, before anything runs, a dataset whose prompts leave no room for a completion."""
    limit = config.max_seq_length - config.max_completion_length
    lengths = [build_prompt(renderer, row, config).length for row in rows]
    if max(lengths) > limit:
        raise StropError(f"a prompt has {max(lengths)} tokens, over max_seq_length - max_completion_length = {limit}; "
                         "raise max_seq_length, lower max_completion_length or shorten the system prompt")


def check_memory(renderer, rows: list[Row], config: GRPOConfig, model_dir, longest: int | None = None) -> int:
    """Refuse, before anything runs, a run whose estimated peak memory is more than is available; else the
    trainer's micro-batch size in tokens that fits (smaller micro-batches, same gradients)."""
    from strop.engine.resources import plan_grpo_memory
    if longest is None:
        longest = max(build_prompt(renderer, row, config).length for row in rows[:2000])
    plan = plan_grpo_memory(model_dir, batch_size=config.batch_size, group_size=config.group_size,
                            prompt_tokens=longest, completion_tokens=config.max_completion_length,
                            what=f"GRPO on {config.base_model} ({config.batch_size} prompts x {config.group_size} "
                                 f"samples x <= {longest} + {config.max_completion_length} tokens)")
    return plan["tokensPerMicroBatch"]


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


def score_group(renderer, terms, row: Row, prompt, sequences) -> Group:
    completions = []
    for seq in sequences:
        message, _ = renderer.parse_response(seq.tokens)
        text = get_text_content(message)
        scored = score_terms(terms, text, row)
        completions.append(Completion(tokens=list(seq.tokens), logprobs=list(seq.logprobs), text=text,
                                      stop_reason=seq.stop_reason, term_scores=scored.scores,
                                      reward=scored.total, errors=list(scored.errors)))
    return Group(row=row, prompt=prompt, completions=completions)


def group_datums(group: Group, advantages_G: torch.Tensor, kl_G: list[list[float]] | None, kl_beta: float) -> list[types.Datum]:
    """Datums in the seed's layout: input = prompt + completion[:-1], targets shifted by one, advantages on
    completion positions only. With a KL penalty each token's advantage loses beta * (log p - log p_base)."""
    datums = []
    ob_len = group.prompt.length - 1
    for g, completion in enumerate(group.completions):
        toks = completion.tokens
        model_input = group.prompt.append(types.EncodedTextChunk(tokens=toks[:-1]))
        adv_T = [float(advantages_G[g])] * len(toks)
        if kl_G is not None:
            adv_T = [a - kl_beta * k for a, k in zip(adv_T, kl_G[g])]
        datums.append(types.Datum(model_input=model_input, loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(torch.tensor([0] * ob_len + toks)),
            "logprobs": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + completion.logprobs)),
            "advantages": types.TensorData.from_torch(torch.tensor([0.0] * ob_len + adv_T)),
        }))
    return datums


def base_kl(base_sampler, group: Group) -> list[list[float]]:
    """Per-token log p_sampler - log p_base for each completion (p_base: the model with the adapter off)."""
    fulls = [group.prompt.append(types.EncodedTextChunk(tokens=c.tokens)) for c in group.completions]
    base_lps = base_sampler.compute_logprobs_many(fulls).result()
    return [[lp - b for lp, b in zip(c.logprobs, base_lp[group.prompt.length:])]
            for c, base_lp in zip(group.completions, base_lps)]


def run_grpo(config: GRPOConfig, run_dir: str | Path, *, service: ServiceClient | None = None,
             progress: bool = True, rows: list[Row] | None = None, on_start=None, on_step=None,
             on_checkpoint=None, on_eval=None) -> RunResult:
    """Train, writing into `run_dir`. `on_start(run_dir, start_step)` is called once the run folder exists,
    `on_step(metrics_row)` after each step's row is written and `on_checkpoint(step, path)` after each
    checkpoint (the control plane copies both into its store). With `config.eval_every`, `on_eval(steps_done,
    training_client, renderer)` runs every that many steps, before the last one (whoever runs the loop
    evaluates the final model)."""
    sandbox = None
    if config.sandbox_graders and any(not str(t.get("grader", "")).startswith("builtin:") for t in config.reward_terms):
        from strop.scoring.sandbox import SandboxPool
        sandbox = SandboxPool(timeout=config.grader_timeout, memory_mb=config.grader_memory_mb, hide=[run_dir])
    try:
        return _run_grpo(config, run_dir, sandbox, service=service, progress=progress, rows=rows, on_start=on_start,
                         on_step=on_step, on_checkpoint=on_checkpoint, on_eval=on_eval)
    finally:
        if sandbox is not None:
            sandbox.close()


def _run_grpo(config: GRPOConfig, run_dir: str | Path, sandbox, *, service, progress, rows, on_start, on_step,
              on_checkpoint, on_eval) -> RunResult:
    """The data (rows, or an environment's tasks), then `_train`; the environments are closed at the end."""
    run_dir = Path(run_dir)
    # everything that can fail on bad input happens before the run folder exists: nothing half-written
    pool = None
    if config.environment:
        from strop.rl.multiturn import EnvPool
        pool = EnvPool(config.environment, config.batch_size * config.group_size)
        rows = pool.tasks(config.environment.get("split", "train"), config.dataset_limit)
    else:
        rows = rows if rows is not None else load_rows(config.dataset, split="train", limit=config.dataset_limit,
                                                       seed=config.seed)
    try:
        return _train(config, run_dir, rows, pool, sandbox, service=service, progress=progress, on_start=on_start,
                      on_step=on_step, on_checkpoint=on_checkpoint, on_eval=on_eval)
    finally:
        if pool is not None:
            pool.close()


def _train(config: GRPOConfig, run_dir: Path, rows, pool, sandbox, *, service, progress, on_start, on_step,
           on_checkpoint, on_eval) -> RunResult:
    if not rows:
        raise StropError(f"dataset {config.dataset!r} has no rows to train on")
    terms = [] if pool is not None else terms_from_spec(config.reward_terms, sandbox=sandbox)
    weights = {t.name: t.weight for t in terms}
    service = service or ServiceClient(sampler_dtype=config.sampler_dtype)
    training = service.create_lora_training_client(base_model=config.base_model, rank=config.lora_rank,
                                                   alpha=config.lora_alpha, seed=config.seed,
                                                   target_modules=config.lora_target_modules,
                                                   compute_dtype=config.compute_dtype)
    tokenizer = training.get_tokenizer()
    from strop import model_info
    renderer = get_renderer(config.renderer or model_info.get_recommended_renderer_name(config.base_model), tokenizer)
    if pool is not None:
        first = renderer.build_tool_prompt([{"role": "user", "content": rows[0].prompt}], pool.envs[0].tools()).length
        # a late turn reads every earlier reply and observation: budget each turn its reply plus an observation
        longest = first + (pool.envs[0].max_turns - 1) * (config.max_completion_length + 200)
        micro_batch = check_memory(renderer, rows, config, resolve_model(config.base_model), longest=longest)
    else:
        if config.max_seq_length:
            check_prompt_lengths(renderer, rows, config)
        micro_batch = check_memory(renderer, rows, config, resolve_model(config.base_model))
    training.set_micro_batch_tokens(micro_batch)
    base_sampler = service.create_sampling_client(base_model=config.base_model) if config.kl_beta > 0 else None
    adam = types.AdamParams(learning_rate=config.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8,
                            weight_decay=config.weight_decay, grad_clip_norm=config.grad_clip_norm)

    run_dir.mkdir(parents=True, exist_ok=True)
    start_step = 0
    found = checkpoints.latest(run_dir)
    if found:
        start_step, path = found
        training.load_state(str(path)).result()
    config.save(run_dir / "config.json")
    if on_start is not None:
        on_start(run_dir, start_step)
    batches = StepBatches(len(rows), config)
    log = RunLog(run_dir, start_step=start_step)
    bar = _progress(len(batches), start_step, progress)
    try:
        for step in range(start_step, len(batches)):
            epoch = batches.pass_of(step)
            batch = [rows[i] for i in batches[step]]
            if pool is not None:
                from strop.rl.multiturn import train_env_step
                row_ = train_env_step(step, batch, config, training, renderer, pool, adam, log, epoch, base_sampler)
            else:
                row_ = _train_step(step, batch, config, training, renderer, terms, weights, base_sampler, adam, log,
                                   epoch)
            log.write_step(row_)
            if on_step is not None:
                on_step(row_)
            if bar is not None:
                bar.set_postfix(reward=f"{row_['reward']:.3f}", zvg=f"{row_['zeroVarianceGroups']:.2f}",
                                len=f"{row_['completionLength']:.0f}", s=f"{row_['stepSeconds']:.1f}")
                bar.update(1)
            if on_eval is not None and config.eval_every and (step + 1) % config.eval_every == 0 \
                    and step + 1 < len(batches):
                on_eval(step + 1, training, renderer)
            if (step + 1) % config.save_every == 0 or step + 1 == len(batches):
                path = checkpoints.save(training, run_dir, step + 1, config.keep_adapters)
                if on_checkpoint is not None:
                    on_checkpoint(step + 1, path)
    finally:
        log.close()
        if bar is not None:
            bar.close()
    final = Path(training.save_weights(str(run_dir / "final")).result().path)
    return RunResult(run_dir=run_dir, steps=len(batches), final_adapter=final,
                     metrics=read_jsonl(run_dir / "metrics.jsonl"))


def apply_update(training, datums, config: GRPOConfig, adam) -> tuple[dict, dict, float]:
    """forward_backward + optim_step on the step's datums (none: no update); their metrics and the seconds."""
    t1 = time.perf_counter()
    fb_metrics, optim_metrics = {}, {}
    if datums:
        fb_metrics = training.forward_backward(datums, loss_fn=config.loss_fn,
                                               loss_fn_config=config.loss_fn_config).result().metrics
        optim_metrics = training.optim_step(adam).result().metrics
    return fb_metrics, optim_metrics, time.perf_counter() - t1


def update_metrics(fb_metrics: dict, optim_metrics: dict, config: GRPOConfig) -> dict:
    """The metrics of a step's update, per trained token."""
    trained = fb_metrics.get("tokens:sum", 0.0)
    row = {"klSampleTrain": fb_metrics["kl_sample_train:sum"] / trained if trained else 0.0,
           "entropy": fb_metrics["entropy:sum"] / trained if trained else None,
           "loss": fb_metrics.get("loss:sum", 0.0), "gradNorm": optim_metrics.get("grad_norm", 0.0),
           "learningRate": config.learning_rate}
    if config.loss_fn == "ppo" and trained:
        row["ppoClippedFraction"] = fb_metrics["clipped:sum"] / trained
    return row


def check_error_fraction(completions, n_terms: int, limit: float, step: int) -> None:
    """Fail the run when more than `limit` of this step's grader calls failed, showing the first errors."""
    calls = len(completions) * n_terms
    errors = [e for c in completions for e in c.errors]
    if calls and len(errors) / calls > limit:
        first = "\n  ".join(list(dict.fromkeys(errors))[:3])  # distinct, in the order they happened
        raise StropError(f"step {step}: {len(errors)} of {calls} grader calls failed, more than the "
                         f"{limit:.0%} allowed (max_reward_error_fraction / config.reward.maxErrorFraction); "
                         f"first errors:\n  {first}")


def _progress(total: int, start: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, initial=start, desc="GRPO", unit="step", file=sys.stderr, dynamic_ncols=True)


def _train_step(step, batch_rows, config, training, renderer, terms, weights, base_sampler, adam, log, epoch) -> dict:
    t0 = time.perf_counter()
    sampler = training.save_weights_and_get_sampling_client()
    prompts = [build_prompt(renderer, row, config) for row in batch_rows]
    futures = []
    for i, prompt in enumerate(prompts):
        params = types.SamplingParams(max_tokens=config.max_completion_length, temperature=config.temperature,
                                      top_p=config.top_p, stop=renderer.get_stop_sequences(),
                                      seed=config.seed * 1_000_003 + step * 1_009 + i)
        futures.append(sampler.sample(prompt=prompt, num_samples=config.group_size, sampling_params=params))
    responses = [f.result() for f in futures]
    sample_seconds = time.perf_counter() - t0

    groups = [score_group(renderer, terms, row, prompt, response.sequences)
              for row, prompt, response in zip(batch_rows, prompts, responses)]
    datums, zero_var, kl_values, rollouts = [], 0, [], []
    for g_index, group in enumerate(groups):
        rewards_G = torch.tensor([c.reward for c in group.completions])
        advantages_G = group_advantages(rewards_G, scale_by_std=config.scale_by_std)
        prompt_text = renderer.tokenizer.decode(group.prompt.to_ints())
        for c, adv in zip(group.completions, advantages_G.tolist()):
            rollouts.append({"step": step, "group": g_index, "prompt": prompt_text, "question": group.row.question,
                             "gold": group.row.gold,
                             "completion": c.text, "reward": c.reward, "advantage": adv, "scores": c.term_scores,
                             "tokens": len(c.tokens), "stop_reason": c.stop_reason, "errors": c.errors})
        if is_zero_variance(rewards_G):
            zero_var += 1
            continue
        kl_G = base_kl(base_sampler, group) if base_sampler is not None else None
        if kl_G is not None:
            kl_values.extend(v for seq in kl_G for v in seq)
        datums.extend(group_datums(group, advantages_G, kl_G, config.kl_beta))

    completions = [c for g in groups for c in g.completions]
    # before the update: a step whose rewards are mostly grader failures must not move the weights
    check_error_fraction(completions, len(terms), config.max_reward_error_fraction, step)
    fb_metrics, optim_metrics, train_seconds = apply_update(training, datums, config, adam)

    rewards = [c.reward for c in completions]
    n_tokens = sum(len(c.tokens) for c in completions)
    row = {
        "step": step, "epoch": epoch,
        "reward": statistics.fmean(rewards),
        "rewardStd": statistics.pstdev(rewards),
        **{f"reward/{name}": weights[name] * statistics.fmean(c.term_scores.get(name, 0.0) for c in completions)
           for name in weights},
        "zeroVarianceGroups": zero_var / len(groups),
        "rewardErrors": sum(len(c.errors) for c in completions),
        "completionLength": n_tokens / len(completions),
        "clippedFraction": sum(c.stop_reason == "length" for c in completions) / len(completions),
        "tokensPerSecond": n_tokens / sample_seconds if sample_seconds > 0 else 0.0,
        "stepSeconds": time.perf_counter() - t0,
        "sampleSeconds": sample_seconds, "trainSeconds": train_seconds, "datums": len(datums),
        **update_metrics(fb_metrics, optim_metrics, config),
    }
    if kl_values:
        row["klBase"] = statistics.fmean(kl_values)
    log.write_rollouts(rollouts)
    return row
