"""One GRPO step, the same for datasets and environments: roll out -> score -> advantages -> datums -> update ->
metrics row.

    ctx = StepContext(config, training, renderer, ProblemSource(terms), adam, log)
    metrics = train_step(ctx, step=0, items=rows[:8], epoch=0)      # a StepMetrics; metrics.as_row() is logged

Each item (a row or a task) starts `group_size` episodes; each rollout's advantage is its reward minus its
group's mean (with branchAtTurn, the group's episodes share their first turns and differ from that turn on:
`strop.rl.branching`; a leading turn every episode wrote alike is left out of the update). Groups whose
rollouts all scored the same (on the total, or on the term `varianceOn` names) carry
no signal and are skipped; with dynamic sampling, further tasks are drawn until `batch_size` groups do
(`strop.rl.dynamic_sampling`). With klBeta > 0 each trained token's advantage pays beta x its KL to the
reference model (`strop.rl.reference`: the model the run started from, or the base); with sft_mix each optimizer
step also trains on a few supervised transcripts (`strop.rl.sft_mix`). A step whose checks mostly
failed stops the run before its update.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from strop import types
from strop.client import process_memory
from strop.rl import dynamic_sampling
from strop.rl import overlong
from strop.rl.advantages import batch_advantages
from strop.rl.branching import play_branched, skips_identical, untrained_turns
from strop.rl.config import GRPOConfig
from strop.rl.loss_choices import CLIPPED_LOSSES, clip_range
from strop.rl.metrics import RunLog
from strop.rl.rollouts import check_errors, play, rollout_datums, turn_kl
from strop.rl.schedule import warmed_up_rate
from strop.rl.types import StepMetrics
from strop.rl.updates import UpdateResult, apply_updates

if TYPE_CHECKING:
    from strop.client import SamplingClient, TrainingClient
    from strop.rl.sft_mix import SFTMix
    from strop.renderers import Renderer
    from strop.rl.dynamic_sampling import TaskDraws
    from strop.rl.episodes import EpisodeSource


@dataclass(frozen=True)
class StepContext:
    """What every step of a run uses: the settings, the clients, the renderer, where episodes come from
    (`strop.rl.episodes.ProblemSource` or `EnvironmentSource`), the optimiser's settings and the run's log."""

    config: GRPOConfig
    training: TrainingClient
    renderer: Renderer
    source: EpisodeSource
    adam: types.AdamParams
    log: RunLog | None = None
    base_sampler: SamplingClient | None = None  # the KL reference (strop.rl.reference), when klBeta > 0
    draw: TaskDraws | None = None               # further tasks for dynamic sampling
    mix: SFTMix | None = None                   # supervised transcripts beside the policy loss (sft_mix)


def adam_params(config) -> types.AdamParams:
    """AdamW as strop's loops use it, from a config's learning_rate, weight_decay and grad_clip_norm."""
    return types.AdamParams(learning_rate=config.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8,
                            weight_decay=config.weight_decay, grad_clip_norm=config.grad_clip_norm)


def training_client(service, config):
    """The run's training client: a fresh LoRA adapter, or the one in `config.init_adapter` to continue from."""
    if config.init_adapter:
        return service.create_training_client_from_adapter(config.base_model, config.init_adapter, seed=config.seed,
                                                           dtype=config.dtype)
    return service.create_lora_training_client(base_model=config.base_model, rank=config.lora_rank,
                                               alpha=config.lora_alpha, seed=config.seed,
                                               target_modules=getattr(config, "lora_target_modules", None),
                                               dtype=config.dtype)


def loss_config(config: GRPOConfig) -> dict:
    """The loss options of forward_backward: the config's own, the clip range when clip_low or clip_high is set,
    GSPO's sequence ratio when chosen, and the truncated importance sampling cap when rollout correction is on."""
    options = dict(config.loss_fn_config)
    if config.clip_low is not None or config.clip_high is not None:
        options["clip_low_threshold"], options["clip_high_threshold"] = map(float, clip_range(config))
    if config.importance_ratio != "token":
        options["importance_ratio"] = config.importance_ratio
    if config.rollout_correction == "tis":
        options["tis_cap"] = float(config.rollout_correction_cap)
    return options


def step_seed(config: GRPOConfig, step: int) -> int:
    return config.seed * 1_000_003 + step * 1_009


@dataclass(frozen=True)
class Sampled:
    """A step's rollouts: sampled under the weights as they were after `policy_step` updates."""

    step: int
    groups: list
    seconds: float       # how long the sampling took
    policy_step: int


def sample_step(ctx: StepContext, step: int, items: list, sampler=None, policy_step: int | None = None) -> Sampled:
    """Roll out `group_size` episodes of each item under `sampler` (default: the current weights). The seed is
    the step's, so a step samples the same way whenever it is sampled."""
    config = ctx.config
    t0 = time.perf_counter()
    sampler = sampler or ctx.training.save_weights_and_get_sampling_client()

    def roll(tasks: list, round_: int = 0) -> list:
        # group terms (a judge ranking a group's completions) once each group is complete, before its variance
        # is judged
        return ctx.source.score_groups(played(tasks, round_))

    def played(tasks: list, round_: int) -> list:
        seed = step_seed(config, step) + dynamic_sampling.ROUND_SEED * round_
        if config.branch_at_turn or config.reference_members:
            return play_branched(sampler, ctx.renderer, lambda n: ctx.source.episodes(tasks, n),
                                 group_size=config.group_size, branch_at=config.branch_at_turn or 1,
                                 max_tokens=config.max_completion_length, temperature=config.temperature,
                                 top_p=config.top_p, seed=seed, scout_temperature=config.scout_temperature,
                                 scout=config.scout, reference_members=config.reference_members,
                                 guide_where=guide_where)
        return play(sampler, ctx.renderer, ctx.source.episodes(tasks, config.group_size),
                    max_tokens=config.max_completion_length, temperature=config.temperature, top_p=config.top_p,
                    seed=seed)

    guide_where = None
    if config.reference_when == "uninformative":  # guide only the groups that would teach nothing
        def guide_where(groups: list) -> list[bool]:
            return [not ok for ok in dynamic_sampling.informative(groups, config.variance_on)]

    groups = roll(items)
    if config.dynamic_sampling and ctx.draw is not None:
        taken = list(items)

        def further(round_: int, n: int) -> list:
            tasks = ctx.draw(step, round_, n, taken)
            taken.extend(tasks)
            return roll(tasks, round_) if tasks else []
        groups = dynamic_sampling.fill_groups(groups, further, batch_size=config.batch_size,
                                              max_tasks=dynamic_sampling.max_tasks(config),
                                              variance_on=config.variance_on)
    return Sampled(step=step, groups=groups, seconds=time.perf_counter() - t0,
                   policy_step=step if policy_step is None else policy_step)


def train_step(ctx: StepContext, step: int, items: list, epoch: int = 0) -> StepMetrics:
    """Sample the step's rollouts with the current weights, then learn from them."""
    return learn_step(ctx, sample_step(ctx, step, items), epoch)


def learn_step(ctx: StepContext, sampled: Sampled, epoch: int = 0, waited: float | None = None) -> StepMetrics:
    """Score, centre, build datums and update from a step's rollouts. `waited`: how long the trainer waited for
    them (less than their sampling time when they were sampled while an earlier step trained)."""
    config, step, groups = ctx.config, sampled.step, sampled.groups
    t0 = time.perf_counter()
    sample_seconds = sampled.seconds
    waited = sample_seconds if waited is None else waited

    datums, kl_values, records = [], [], []
    flags = dynamic_sampling.informative(groups, config.variance_on)
    zero_var = flags.count(False)
    # with dynamic sampling the step trains on batch_size informative groups, however many it drew
    kept = set(dynamic_sampling.kept_groups(groups, config.variance_on,
                                            config.batch_size if config.dynamic_sampling else None))
    skip_identical, untrained = skips_identical(config), 0
    # overlong soft-penalty shapes the rewards the advantages compare (not the reward reported, nor which
    # groups are informative); the estimator sees every group, reinforce++ normalising over the trained ones
    penalties = [[overlong.penalty(r, config) for r in group] for group in groups]
    advantages = batch_advantages([torch.tensor([r.reward + p for r, p in zip(group, pens)])
                                   for group, pens in zip(groups, penalties)],
                                  config.advantage_estimator, config.scale_by_std, normalise_over=sorted(kept))
    masked = 0
    for g, (group, advantages_G) in enumerate(zip(groups, advantages)):
        # a branched group's shared prefix, and turns the whole group wrote alike: no advantage, no compute
        untrained_G = untrained_turns(group, skip_identical)
        for rollout, advantage, n, pen in zip(group, advantages_G.tolist(), untrained_G, penalties[g]):
            records.append({"step": step, "group": g, "reward": rollout.reward, "advantage": advantage,
                            **({"reference": True} if rollout.reference else {}),
                            **({"untrainedTurns": n} if n else {}), **({"overlongPenalty": pen} if pen else {}),
                            **ctx.source.record(rollout, ctx.renderer)})
        if g not in kept:
            continue
        # overlong mask: a rollout cut at the token limit stays in its group's baseline but is not trained
        trained_G = [i for i, r in enumerate(group) if not overlong.masked(r, config)]
        masked += len(group) - len(trained_G)
        group, advantages_G = [group[i] for i in trained_G], advantages_G[trained_G]
        untrained_G = [untrained_G[i] for i in trained_G]
        untrained += sum(untrained_G)
        kl_G = turn_kl(ctx.base_sampler, group, untrained_G) if ctx.base_sampler is not None else None
        if kl_G is not None:
            kl_values.extend(v for rollout in kl_G for turn in rollout for v in turn)
        datums.extend(rollout_datums(group, advantages_G, kl_G, config.kl_beta, untrained_G))

    rollouts = [r for group in groups for r in group]
    # before the update: a step whose rewards are mostly failures must not move the weights
    check_errors(rollouts, config.max_reward_error_fraction, step, ctx.source.failure)
    t1 = time.perf_counter()
    adam = ctx.adam
    if config.warmup_steps:
        adam = dataclasses.replace(adam, learning_rate=warmed_up_rate(adam.learning_rate, step, config.warmup_steps))
    update = apply_updates(ctx.training, datums, config, adam, loss_config(config), mix=ctx.mix, step=step) \
        if datums else UpdateResult()
    fb, optim = update.first_pass, update.optim
    train_seconds = time.perf_counter() - t1
    clipping = config.loss_fn in CLIPPED_LOSSES

    # what the model did: the reference members' episodes (referenceMembers) are left out of what is reported
    rollouts = [r for r in rollouts if not r.reference] or rollouts
    turns = [t for r in rollouts for t in r.turns]
    n_tokens = sum(len(t.tokens) for t in turns)
    rewards = [r.reward for r in rollouts]
    trained = fb.get("tokens:sum", 0.0)
    metrics = StepMetrics(
        step=step, epoch=epoch, reward=statistics.fmean(rewards), rewardStd=statistics.pstdev(rewards),
        zeroVarianceGroups=zero_var / len(groups), rewardErrors=sum(r.failed for r in rollouts),
        completionLength=n_tokens / len(rollouts),
        clippedFraction=sum(t.stop_reason == "length" for t in turns) / max(1, len(turns)),
        tokensPerSecond=n_tokens / sample_seconds if sample_seconds > 0 else 0.0,
        stepSeconds=time.perf_counter() - t0 + waited, sampleSeconds=sample_seconds, trainSeconds=train_seconds,
        datums=len(datums),
        klSampleTrain=fb["kl_sample_train:sum"] / trained if trained else 0.0,
        klSampleTrainMax=fb.get("kl_sample_train:max") if trained else None,
        samplerRatioOutside=fb.get("ratio_outside:sum", 0.0) / trained if trained else None,
        entropy=fb["entropy:sum"] / trained if trained else None,
        loss=fb.get("loss:sum", 0.0), learningRate=adam.learning_rate,
        gradNorm=None if optim.get("skipped_nonfinite") else optim.get("grad_norm", 0.0),  # NaN is no norm
        updateSkipped=int(optim.get("skipped_nonfinite", 0)),
        ppoClippedFraction=fb["clipped:sum"] / trained if config.loss_fn == "ppo" and trained else None,
        klBase=statistics.fmean(kl_values) if kl_values else None,
        sftMixLoss=update.mix_loss,
        offPolicySteps=step - sampled.policy_step if config.max_off_policy_steps else None,
        overlapSeconds=max(0.0, sample_seconds - waited) if config.max_off_policy_steps else None,
        tasksDrawn=len(groups) if config.dynamic_sampling else None,
        groupsKept=len(kept) if config.dynamic_sampling else None,
        groupsDropped=len(groups) - len(kept) if config.dynamic_sampling else None,
        guidedGroups=sum(any(r.reference for r in group) for group in groups) if config.reference_members else None,
        trainedTokens=trained,
        untrainedTurns=untrained if config.branch_at_turn or skip_identical else None,
        overlongMasked=masked if config.overlong == "mask" else None,
        overlongPenalty=statistics.fmean(p for pens in penalties for p in pens)
        if config.overlong == "soft-penalty" else None,
        updateClippedFractions=update.clipped_shares if clipping else None,
        optimizerSteps=update.optimizer_steps if config.updates_per_batch > 1 or config.minibatches > 1 else None,
        **process_memory(),
        **ctx.source.metrics(rollouts))
    if ctx.log is not None:
        ctx.log.write_rollouts(records)
    return metrics
