"""The settings of one GRPO run, checked as a whole before anything loads.

    config = GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", group_size=4, max_steps=3)

Every field has a help string; `validate()` returns every problem at once, each naming the field and what
would be accepted, and `__post_init__` raises them together as one StropError.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
import math
from pathlib import Path

from strop.choices import DTYPE_CHOICES, POLICY_LOSSES, SAMPLER_CHOICES
from strop.cluster.settings import RaySettings
from strop.errors import StropError
from strop.rl.limits import LIMITS
from strop.rl.dynamic_sampling import sampling_problems
from strop.rl.loss_choices import choice_problems, combination_problems
from strop.rl.branching import IDENTICAL_TURNS, branching_problems
from strop.trackers import CHOICES as TRACKER_CHOICES, DEFAULT as DEFAULT_TRACKERS, report_to_problems

KL_REFERENCES = ("start", "base")

LOSS_FNS = POLICY_LOSSES  # the policy-gradient losses (strop.choices; the engine implements them)


def _help(text: str, default=None, factory=None, descriptor: str | None = None):
    """A field with its help text and, when a run descriptor sets it, the descriptor's JSON path."""
    metadata = {"help": text, **({"descriptor": "$." + descriptor} if descriptor else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


_HP = "config.rlHyperparams."


@dataclass
class GRPOConfig:
    base_model: str = _help("base model: a catalog id, hub id, local HF directory or strop/tiny-random",
                            "HuggingFaceTB/SmolLM2-135M-Instruct", descriptor="baseModel")
    dataset: str = _help("rows to train on: synthetic[:LEVEL], gsm8k, or a .jsonl/.json/.parquet file", "synthetic:add")
    dataset_limit: int | None = _help("use only the first N rows (None: all)", None)
    reward_terms: list = _help('reward terms: [{"name": ..., "weight": ..., "grader": "builtin:gsm8k" | PATH#MODULE:FUNCTION}]',
                               factory=lambda: [{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"}])
    environment: dict | None = _help('a tool-use environment instead of a dataset: {"name": "finance-sql", '
                                     '"options": {...}, "split": "train"}; episodes of several turns, rewarded by '
                                     'the environment', None)
    group_size: int = _help("completions sampled per prompt; GRPO compares them with each other", 8,
                            descriptor=_HP + "groupSize")
    batch_size: int = _help("prompts per step", 8, descriptor=_HP + "batchSize")
    epochs: int = _help("passes over the dataset when max_steps is None", 1, descriptor=_HP + "epochs")
    max_steps: int | None = _help("the number of steps: the rows are reshuffled each pass until it is reached, "
                                  "epochs notwithstanding (None: `epochs` passes)", None, descriptor=_HP + "maxSteps")
    learning_rate: float = _help("AdamW learning rate for the LoRA weights", 1e-4,
                                 descriptor=_HP + "optimizer.learningRate")
    weight_decay: float = _help("AdamW weight decay", 0.0, descriptor=_HP + "optimizer.weightDecay")
    grad_clip_norm: float = _help("clip the gradient to this global norm (0: no clipping)", 1.0,
                                  descriptor=_HP + "optimizer.gradClipNorm")
    warmup_steps: int = _help("raise the learning rate linearly over the first N steps (step s uses learning_rate x "
                              "(s + 1) / N); 0: the full rate from the first step", 0,
                              descriptor=_HP + "optimizer.warmupSteps")
    lora_rank: int = _help("LoRA rank", 32, descriptor=_HP + "lora.rank")
    lora_alpha: float | None = _help("LoRA alpha (None: equal to the rank, a scale of 1)", None,
                                     descriptor=_HP + "lora.alpha")
    init_adapter: str | None = _help("start from this LoRA adapter folder (a supervised warm start's final/, a tuned "
                                     "model's): its weights, rank, alpha and target modules; None: a fresh adapter",
                                     None)
    lora_target_modules: list | None = _help("module names LoRA adapts (None: every attention and MLP projection)", None,
                                             descriptor=_HP + "lora.targetModules")
    temperature: float = _help("sampling temperature; logprobs are exact behaviour-policy logprobs only at 1.0", 1.0,
                               descriptor=_HP + "temperature")
    top_p: float = _help("nucleus sampling mass", 1.0)
    max_completion_length: int = _help("most tokens per completion", 256, descriptor=_HP + "maxCompletionLength")
    max_seq_length: int | None = _help("refuse prompts longer than this minus max_completion_length", None,
                                       descriptor="config.maxSeqLength")
    kl_beta: float = _help("weight of the KL penalty to the reference model (kl_reference); 0 disables it", 0.0,
                           descriptor=_HP + "klBeta")
    kl_reference: str = _help("what the KL penalty measures drift from: start, the model the run started from "
                              "(init_adapter's weights, a frozen copy; the base model when there is none), or base, "
                              "the base model with the adapter off (a run from a warm start then pays for keeping "
                              "what the warm start learnt)", "start", descriptor=_HP + "klReference")
    variance_on: str | None = _help("the reward term whose spread within a group decides whether the group teaches "
                                    "anything (for an environment, a term its episodes report, e.g. finance-sql's "
                                    "correctness); None: the total reward. A group whose episodes all score the same "
                                    "on it is dropped", None, descriptor=_HP + "varianceOn")
    dynamic_sampling: bool = _help("DAPO's dynamic sampling: when groups are dropped for zero variance, draw further "
                                   "tasks (at random, seeded per step) until batch_size groups have variance or "
                                   "max_tasks_per_step tasks were drawn; metrics record tasksDrawn, groupsKept and "
                                   "groupsDropped", False, descriptor=_HP + "dynamicSampling.enabled")
    max_tasks_per_step: int | None = _help("the most tasks dynamic sampling draws for one step, its first batch "
                                           "included (None: 4 x batch_size)", None,
                                           descriptor=_HP + "dynamicSampling.maxTasksPerStep")
    branch_at_turn: int | None = _help("branch each group at this model turn (1-based; an environment's episodes): "
                                       "one episode is played up to it, then group_size episodes are sampled on "
                                       "from exactly that state, so the group's mean is a baseline for that turn's "
                                       "decision; the shared turns are sampled and trained once and carry no "
                                       "advantage. An episode that ends sooner branches at its last turn. Needs an "
                                       "environment that gives the same observations for the same task and calls "
                                       "(strop.rl.branching); 1: an ordinary group; None: no branching", None,
                                       descriptor=_HP + "branchAtTurn")
    identical_turns: str = _help(f"turns every episode of a group wrote alike (same context, same tokens): one of "
                                 f"{', '.join(IDENTICAL_TURNS)}. skip leaves them out of the update (no advantage, "
                                 "no trainer compute); train trains them as before; auto skips them where that "
                                 "changes no gradient (loss importance_sampling or cispo, kl_beta 0: their advantages "
                                 "cancel over the group) and trains them elsewhere", "auto",
                                 descriptor=_HP + "identicalTurns")
    scale_by_std: bool = _help("divide group-centred advantages by the group's reward std", False)
    advantage_estimator: str = _help("the baseline each reward is compared with: group-mean (GRPO), rloo (the mean "
                                     "of the group's other samples) or reinforce++ (group mean, then every "
                                     "advantage over the trained groups' std); strop.rl.advantages", "group-mean",
                                     descriptor=_HP + "advantageEstimator")
    loss_fn: str = _help(f"policy loss: one of {', '.join(LOSS_FNS)}", "importance_sampling",
                         descriptor=_HP + "lossFn")
    loss_aggregation: str = _help("how the update's per-token losses add up: token-sum (every token, summed), "
                                  "token-mean (over the update's trained tokens: DAPO), sequence-mean (each "
                                  "sequence's mean, then their mean: the original GRPO) or constant (the sum "
                                  "over loss_normalizer: Dr. GRPO)", "token-sum", descriptor=_HP + "lossAggregation")
    loss_normalizer: float | None = _help("what loss_aggregation constant divides by (None: batch_size x group_size "
                                          "x max_completion_length)", None, descriptor=_HP + "lossNormalizer")
    overlong: str = _help("completions cut at max_completion_length: keep (trained like the rest), mask (left out "
                          "of the loss, still in their group's baseline) or soft-penalty (DAPO: the reward falls "
                          "linearly by up to 1 over the last overlong_buffer tokens)", "keep",
                          descriptor=_HP + "overlong")
    overlong_buffer: int | None = _help("tokens before max_completion_length where soft-penalty's penalty grows "
                                        "from 0 to 1 (None: a quarter of max_completion_length)", None,
                                        descriptor=_HP + "overlongBuffer")
    importance_ratio: str = _help("the ratio p / q the loss weighs and clips: token (each token's) or sequence "
                                  "(GSPO: the geometric mean over the sequence's tokens, one per sequence)", "token",
                                  descriptor=_HP + "importanceRatio")
    clip_low: float | None = _help("ppo and cispo: the lowest ratio kept (None: 0.8)", None,
                                   descriptor=_HP + "clipLow")
    clip_high: float | None = _help("ppo and cispo: the highest ratio kept (None: 1.2; DAPO's clip-higher raises "
                                    "it alone, e.g. 1.28)", None, descriptor=_HP + "clipHigh")
    updates_per_batch: int = _help("optimizer passes over each sampled batch; past the first, the ratio is taken "
                                   "against the trainer's logprobs before the first update, so ppo's clip binds",
                                   1, descriptor=_HP + "updatesPerBatch")
    minibatches: int = _help("optimizer steps each pass makes, each on its share of the batch's datums", 1,
                             descriptor=_HP + "minibatches")
    loss_fn_config: dict = _help("loss options, e.g. {'clip_low_threshold': 0.8, 'clip_high_threshold': 1.2}", factory=dict)
    rollout_correction: str = _help("off, or tis: truncated importance sampling, each token's advantage times "
                                    "min(p_train / p_sampler, rollout_correction_cap), for the mismatch between "
                                    "the sampler's and the trainer's numbers (bf16, another engine)", "off",
                                    descriptor="config.rolloutCorrection.mode")
    rollout_correction_cap: float = _help("the largest importance weight tis gives a token", 2.0,
                                          descriptor="config.rolloutCorrection.cap")
    system_prompt: str | None = _help("system message before each question (None: none)", None)
    question_suffix: str = _help("text appended to each question", "")
    renderer: str | None = _help("renderer name (None: the model's recommended one)", None)
    sandbox_graders: bool = _help("run bundle graders confined by the operating system (strop.scoring.sandbox: "
                                  "no network, read-only files, time and memory limits, no secrets); built-in "
                                  "graders always run in-process", True)
    grader_timeout: float = _help("seconds a sandboxed grader call may take before it scores 0 and its processes "
                                  "are killed", 10.0, descriptor="config.reward.timeoutSeconds")
    grader_memory_mb: int = _help("memory limit of a grader's processes together where cgroups allow, and of each "
                                  "process's address space in any case, in MiB", 2048,
                                  descriptor="config.reward.memoryMb")
    max_reward_error_fraction: float = _help("fail the run when more than this fraction of a step's grader calls "
                                             "fail (raise, hang, crash, non-number)", 0.5,
                                             descriptor="config.reward.maxErrorFraction")
    eval_every: int | None = _help("call the run's evaluation hook every N steps (control-plane runs evaluate on their "
                                   "project's evaluation dataset); None: never", None, descriptor="config.evalEvery")
    save_every: int = _help("checkpoint every N steps (the last step is always saved)", 10,
                            descriptor="execution.saveEvery")
    keep_adapters: int = _help("checkpoints to keep", 4, descriptor="execution.keepAdapters")
    seed: int = _help("seed for data order, LoRA init and sampling", 0)
    dtype: str = _help("what the trainer and the sampler compute in: auto (training in bfloat16 where the hardware "
                       "has bf16 units: a CPU with AVX-512 BF16 or AMX, or a CUDA GPU; float32 elsewhere; sampling "
                       "in float32 on a CPU), float32 or bfloat16 (both); LoRA weights and every logprob and loss "
                       "stay float32 (strop.engine.precision)", "auto",
                       descriptor="execution.dtype")
    sampler: str = _help("which engine samples: auto (vLLM on a CUDA GPU where it is installed, strop's own decoder "
                         "elsewhere: the faster on a CPU), strop, or vllm (pip install -e \".[vllm]\"; "
                         "strop.engine.engine_choice)", "auto", descriptor="execution.sampler")
    ray: dict | None = _help('place sampler replicas and environment workers on a Ray cluster: {"address": "auto" | '
                             '"HOST:PORT", "samplers": N, "envWorkers": N} (strop.cluster; pip install -e ".[ray]"); '
                             'None: everything in this process', None, descriptor="execution.ray")
    gpus: int | None = _help("GPUs the run asks for: 0 computes on the CPU, 1 on a CUDA GPU (on the CPU where torch "
                             "sees none); more need execution.ray, a data-parallel trainer a GPU; None: a GPU where "
                             "there is one (strop.engine.precision.run_device)", None, descriptor="execution.gpus")
    report_to: list = _help(f"the experiment trackers the run's metrics, config and sample rollouts go to, from "
                            f"{', '.join(TRACKER_CHOICES)} (each but tensorboard an extra: pip install -e "
                            f"\".[trackers]\"; strop.trackers); []: none, metrics.jsonl only",
                            factory=lambda: list(DEFAULT_TRACKERS), descriptor="execution.reportTo")
    report_rollouts_every: int | None = _help("send a table of the first rollouts of every Nth step (0, N, 2N, ...) "
                                              "to the trackers that have tables; None: no tables", 10,
                                              descriptor="execution.reportRolloutsEvery")
    max_off_policy_steps: int = _help("sample up to this many steps ahead while the trainer updates (0: every step "
                                      "samples with the weights it trains): rollouts at most this many updates old, "
                                      "their sampler logprobs correcting the update (importance sampling)", 0,
                                      descriptor="execution.maxOffPolicySteps")

    def __post_init__(self):
        problems = self.validate()
        if problems:
            raise StropError("invalid training config:\n  " + "\n  ".join(problems))

    @classmethod
    def problems_of(cls, values: dict) -> list[tuple[str, str]]:
        """(field, what is wrong) for every problem of a config with these values (the rest at their defaults),
        without making it: each front end (run descriptor, `strop train`, quickstart, Python) names the fields in
        its own words, a JSON path or a flag, from this one validator."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            return [(name, "unknown training config field" + "".join(
                f" (did you mean {close[0]!r}?)" for close in [difflib.get_close_matches(name, known, 1)] if close)
                + f"; known fields: {', '.join(sorted(known))}") for name in unknown]
        draft = cls.__new__(cls)
        for f in fields(cls):
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            setattr(draft, f.name, values.get(f.name, default))
        return draft.field_problems()

    @classmethod
    def descriptor_paths(cls) -> dict[str, str]:
        """field -> the JSON path of the run descriptor setting it (`$.config.rlHyperparams.groupSize`)."""
        return {f.name: f.metadata["descriptor"] for f in fields(cls) if "descriptor" in f.metadata}

    def validate(self) -> list[str]:
        return [f"{name}: {problem}" for name, problem in self.field_problems()]

    def field_problems(self) -> list[tuple[str, str]]:
        p = []
        # every size, count and number within its range (strop.rl.limits: the same table the descriptor's
        # structure check uses)
        for name, limit in LIMITS.items():
            if name in _FIELDS:
                problem = limit.problem(getattr(self, name))
                if problem:
                    p.append((name, problem))
        if self.loss_fn not in LOSS_FNS:
            p.append(("loss_fn", f"must be one of {', '.join(LOSS_FNS)}, got {self.loss_fn!r}"))
        if self.rollout_correction not in ("off", "tis"):
            p.append(("rollout_correction", f"must be off or tis, got {self.rollout_correction!r}"))
        if self.rollout_correction == "tis" and self.loss_fn not in POLICY_LOSSES:
            p.append(("rollout_correction", f"tis corrects a policy loss ({', '.join(POLICY_LOSSES)}), not "
                                            f"{self.loss_fn!r}"))
        p.extend(choice_problems(self))
        p.extend(combination_problems(self))
        if self.kl_reference not in KL_REFERENCES:
            p.append(("kl_reference", f"must be one of {', '.join(KL_REFERENCES)}, got {self.kl_reference!r}"))
        p.extend(sampling_problems(self))
        p.extend(branching_problems(self))
        if self.dtype not in DTYPE_CHOICES:
            p.append(("dtype", f"must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}"))
        if self.sampler not in SAMPLER_CHOICES:
            p.append(("sampler", f"must be one of {', '.join(SAMPLER_CHOICES)}, got {self.sampler!r}"))
        if self.ray is not None:
            p.extend(("ray", problem) for problem in RaySettings.problems(self.ray))
        p.extend(("report_to", problem) for problem in report_to_problems(self.report_to))
        if _is_int(self.max_seq_length) and _is_int(self.max_completion_length) \
                and self.max_seq_length <= self.max_completion_length:
            p.append(("max_seq_length", f"must exceed max_completion_length ({self.max_completion_length}) to "
                                        f"leave room for the prompt (got {self.max_seq_length})"))
        if self.init_adapter is not None and not (isinstance(self.init_adapter, str)
                                                  and (Path(self.init_adapter) / "adapter_config.json").is_file()):
            p.append(("init_adapter", f"{str(self.init_adapter)[:200]!r} is not a LoRA adapter folder (no "
                                      "adapter_config.json); pass a folder a run wrote, such as its final/"))
        if self.environment is not None:
            env = self.environment
            if not isinstance(env, dict) or not isinstance(env.get("name"), str) \
                    or not isinstance(env.get("options", {}), dict) or set(env) - {"name", "options", "split"}:
                p.append(("environment", f"must be {{'name': ..., 'options': {{...}}, 'split': 'train'}}, got "
                                         f"{repr(env)[:200]}"))
        if not isinstance(self.reward_terms, list) or not self.reward_terms:
            p.append(("reward_terms", "give at least one term, e.g. [{'name': 'correct', 'weight': 1.0, "
                                      "'grader': 'builtin:gsm8k'}]"))
        else:
            for i, term in enumerate(self.reward_terms):
                problem = LIMITS["reward_weight"].problem(term.get("weight", 1.0) if isinstance(term, dict) else None)
                if problem:
                    p.append((f"reward_terms[{i}].weight", problem))
        return p

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def defaults(cls) -> dict:
        """Every field that has a plain default, by name (what a config saved before the field existed meant)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    @classmethod
    def from_dict(cls, data: dict) -> GRPOConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise StropError(f"unknown training config fields {unknown}; known fields: {', '.join(sorted(known))}")
        return cls(**data)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}


_FIELDS = frozenset(f.name for f in fields(GRPOConfig))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def plan_steps(n_rows: int, batch_size: int, max_steps: int | None, epochs: int) -> tuple[int, int]:
    """(steps, passes over the rows) a run makes. `max_steps` is the number of steps, the rows passed over as often
    as that takes (HF Trainer's convention: max_steps overrides epochs); without it, `epochs` passes."""
    per_pass = max(1, math.ceil(n_rows / batch_size))
    if max_steps:
        return max_steps, math.ceil(max_steps / per_pass)
    return epochs * per_pass, epochs


def count_steps(n_rows: int, config: GRPOConfig) -> tuple[int, int]:
    """`plan_steps` for a config."""
    return plan_steps(n_rows, config.batch_size, config.max_steps, config.epochs)
