"""The settings of one GRPO run, checked as a whole before anything loads.

    config = GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", group_size=4, max_steps=3)

Every field has a help string; `validate()` returns every problem at once, each naming the field and what
would be accepted, and `__post_init__` raises them together as one StropError.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, fields
import math
from pathlib import Path

from strop.choices import POLICY_LOSSES, SAMPLER_CHOICES
from strop.errors import StropError
from strop.rl.limits import LIMITS
from strop.rl.dynamic_sampling import sampling_problems
from strop.rl.loss_choices import (ADVANTAGE_ESTIMATORS, IMPORTANCE_RATIOS, LOSS_AGGREGATIONS, OVERLONG,
                                   combination_problems)
from strop.rl.branching import IDENTICAL_TURNS, REFERENCE_WHEN, SCOUTS, branching_problems
from strop.rl import task_pool
from strop.rl.settings import TrainingSettings, setting

KL_REFERENCES = ("start", "base")
ROLLOUT_CORRECTIONS = ("auto", "off", "tis")

LOSS_FNS = POLICY_LOSSES  # the policy-gradient losses (strop.choices; the engine implements them)


_HP = "{hp}."


@dataclass
class GRPOConfig(TrainingSettings):
    dataset: str = setting("synthetic:add", "rows to train on: synthetic[:LEVEL] (levels: add, add-sub, mul, mixed, "
                           "word-1, word-2, word-3), gsm8k, or a .jsonl/.json/.parquet file with question and answer "
                           "fields", flag="--dataset")
    dataset_limit: int | None = setting(None, "use only the first N rows of the dataset (or tasks of the "
                                        "environment); unset: all", flag="--limit", metavar="N")
    reward_terms: list = setting(help='reward terms: [{"name": ..., "weight": ..., "grader": "builtin:gsm8k" | '
                                 'PATH#MODULE:FUNCTION}]',
                                 factory=lambda: [{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"}])
    environment: dict | None = setting(None, 'a tool-use environment instead of a dataset: {"name": "finance-sql", '
                                       '"options": {...}, "split": "train"}; episodes of several turns, rewarded by '
                                       'the environment; "tasks": a pool file (`strop envs eval --pool-out`) or task '
                                       'ids trains on those tasks of the split only')
    group_size: int = setting(8, "completions sampled per prompt, at least 2; GRPO compares them with each other",
                              flag="--group-size", descriptor=_HP + "groupSize")
    warmup_steps: int = setting(0, "raise the learning rate linearly over the first N steps (step s uses "
                                "learning_rate x (s + 1) / N); 0: the full rate from the first step",
                                flag="--warmup-steps", descriptor=_HP + "optimizer.warmupSteps", metavar="N")
    lora_target_modules: list | None = setting(None, "module names LoRA adapts (unset: every attention and MLP "
                                               "projection)", descriptor=_HP + "lora.targetModules")
    temperature: float = setting(1.0, "sampling temperature; logprobs are exact behaviour-policy logprobs only at 1.0",
                                 flag="--temperature", descriptor=_HP + "temperature")
    top_p: float = setting(1.0, "nucleus sampling mass")
    max_completion_length: int = setting(256, "most tokens per completion", flag="--max-tokens",
                                         descriptor=_HP + "maxCompletionLength")
    max_seq_length: int | None = setting(None, "refuse prompts longer than this minus max_completion_length",
                                         descriptor="config.maxSeqLength")
    kl_beta: float = setting(0.0, "weight of the KL penalty to the reference model (kl_reference); 0 disables it",
                             flag="--kl-beta", descriptor=_HP + "klBeta")
    kl_reference: str = setting("start", "what the KL penalty measures drift from: start, the model the run started "
                                "from (init_adapter's weights, a frozen copy; the base model when there is none), or "
                                "base, the base model with the adapter off (a run from a warm start then pays for "
                                "keeping what the warm start learnt)", flag="--kl-reference",
                                descriptor=_HP + "klReference", choices=KL_REFERENCES)
    sft_mix: str | None = setting(None, "a supervised .jsonl file (strop sft's format: chat transcripts, an "
                                  "assistant turn with \"weight\": 0 untrained) whose cross-entropy joins every "
                                  "optimizer step, sft_mix_examples transcripts at a time, times sft_mix_weight "
                                  "(InstructGPT's PPO-ptx): it holds what the warm start taught on the tasks a step's "
                                  "groups do not cover, which a policy gradient from a few groups can drag along; "
                                  "unset: none", flag="--sft-mix", descriptor=_HP + "sftMix.data", metavar="FILE")
    sft_mix_weight: float = setting(0.1, "what sft_mix's cross-entropy is multiplied by before it joins the policy "
                                    "loss (both are sums over tokens)", flag="--sft-mix-weight",
                                    descriptor=_HP + "sftMix.weight")
    sft_mix_examples: int = setting(4, "sft_mix transcripts each optimizer step trains on, drawn at random (seeded "
                                    "by the run's seed and the step) from the file", flag="--sft-mix-examples",
                                    descriptor=_HP + "sftMix.examplesPerStep", metavar="N")
    variance_on: str | None = setting(None, "the reward term whose spread within a group decides whether the group "
                                      "teaches anything (for an environment, a term its episodes report, e.g. "
                                      "finance-sql's correctness); unset: the total reward. A group whose episodes "
                                      "all score the same on it is dropped", flag="--variance-on",
                                      descriptor=_HP + "varianceOn", metavar="TERM")
    dynamic_sampling: bool = setting(False, "DAPO's dynamic sampling: when groups are dropped for zero variance, "
                                     "draw further tasks (at random, seeded per step) until batch_size groups have "
                                     "variance or max_tasks_per_step tasks were drawn; metrics record tasksDrawn, "
                                     "groupsKept and groupsDropped", flag="--dynamic-sampling",
                                     descriptor=_HP + "dynamicSampling.enabled")
    max_tasks_per_step: int | None = setting(None, "the most tasks dynamic sampling draws for one step, its first "
                                             "batch included (unset: 4 x batch_size)", flag="--max-tasks-per-step",
                                             descriptor=_HP + "dynamicSampling.maxTasksPerStep", metavar="N")
    branch_at_turn: int | None = setting(None, "branch each group at this model turn (1-based; an environment's "
                                         "episodes): one episode is played up to it, then group_size episodes are "
                                         "sampled on from exactly that state, so the group's mean is a baseline for "
                                         "that turn's decision; the shared turns are sampled and trained once and "
                                         "carry no advantage. An episode that ends sooner branches at its last turn. "
                                         "Needs an environment that gives the same observations for the same task "
                                         "and calls (strop.rl.branching); 1: an ordinary group; unset: no branching",
                                         flag="--branch-at-turn", descriptor=_HP + "branchAtTurn", metavar="N")
    scout_temperature: float | None = setting(None, "with branch_at_turn, the temperature the one episode played "
                                              "up to the branch samples at (0: greedy, the state the model's own "
                                              "evaluation reaches); unset: the run's temperature. The group's "
                                              "continuations sample at the run's temperature either way",
                                              flag="--scout-temperature", descriptor=_HP + "scoutTemperature",
                                              metavar="T")
    scout: str = setting("policy", "with branch_at_turn, who plays the turns before the branch: policy (the model "
                         "being trained, at scout_temperature) or reference (the environment's reference_calls(task), "
                         "a known-good agent's calls, e.g. finance-sql's scripted one), so every group branches from "
                         "the state a good agent reaches and the turn trained is the decision made there",
                         flag="--scout", descriptor=_HP + "scout", choices=SCOUTS)
    reference_members: int = setting(0, "of each group's group_size episodes, how many play the environment's "
                                     "reference_calls(task) to the end instead of sampling (off-policy guidance, as "
                                     "in LUFFY): a group the model fails whole still has a right episode to learn "
                                     "from. Their tokens are trained with the advantage they earn, priced under the "
                                     "weights that sampled the step; the step's reward counts sampled episodes only. "
                                     "With branch_at_turn, needs scout reference (they go on from its state)",
                                     flag="--reference-members", descriptor=_HP + "referenceMembers", metavar="N")
    reference_when: str = setting("always", "which groups the reference_members play the reference calls in: "
                                  "always (every group), or uninformative (only a group whose sampled episodes all "
                                  "score alike on variance_on, which would teach nothing: one the model fails whole; "
                                  "the other groups sample those episodes too, so a group the model half solves "
                                  "learns from its own episodes alone)", flag="--reference-when",
                                  descriptor=_HP + "referenceWhen", choices=REFERENCE_WHEN)
    identical_turns: str = setting("auto", "turns every episode of a group wrote alike (same context, same tokens): "
                                   "skip leaves them out of the update (no advantage, no trainer compute); train "
                                   "trains them as before; auto skips them where that changes no gradient (loss_fn "
                                   "importance_sampling or cispo, kl_beta 0: their advantages cancel over the group) "
                                   "and trains them elsewhere", flag="--identical-turns",
                                   descriptor=_HP + "identicalTurns", choices=IDENTICAL_TURNS)
    scale_by_std: bool = setting(False, "divide group-centred advantages by the group's reward std",
                                 flag="--scale-by-std")
    advantage_estimator: str = setting("group-mean", "the baseline each reward is compared with: group-mean (GRPO), "
                                       "rloo (the mean of the group's other samples) or reinforce++ (group mean, then "
                                       "every advantage over the trained groups' std); strop.rl.advantages",
                                       flag="--advantage-estimator", descriptor=_HP + "advantageEstimator",
                                       choices=ADVANTAGE_ESTIMATORS)
    loss_fn: str = setting("importance_sampling", "the policy loss", flag="--loss", descriptor=_HP + "lossFn",
                           choices=LOSS_FNS)
    loss_aggregation: str = setting("token-sum", "how the update's per-token losses add up: token-sum (every token, "
                                    "summed), token-mean (over the update's trained tokens: DAPO), sequence-mean "
                                    "(each sequence's mean, then their mean: the original GRPO) or constant (the sum "
                                    "over loss_normalizer: Dr. GRPO)", flag="--loss-aggregation",
                                    descriptor=_HP + "lossAggregation", choices=LOSS_AGGREGATIONS)
    loss_normalizer: float | None = setting(None, "what loss_aggregation constant divides by (unset: batch_size x "
                                            "group_size x max_completion_length)", flag="--loss-normalizer",
                                            descriptor=_HP + "lossNormalizer", metavar="C")
    overlong: str = setting("keep", "completions cut at max_completion_length: keep (trained like the rest), mask "
                            "(left out of the loss, still in their group's baseline) or soft-penalty (DAPO: the "
                            "reward falls linearly by up to 1 over the last overlong_buffer tokens)", flag="--overlong",
                            descriptor=_HP + "overlong", choices=OVERLONG)
    overlong_buffer: int | None = setting(None, "tokens before max_completion_length where soft-penalty's penalty "
                                          "grows from 0 to 1 (unset: a quarter of max_completion_length)",
                                          flag="--overlong-buffer", descriptor=_HP + "overlongBuffer", metavar="N")
    importance_ratio: str = setting("token", "the ratio p / q the loss weighs and clips: token (each token's) or "
                                    "sequence (GSPO: the geometric mean over the sequence's tokens, one per sequence)",
                                    flag="--importance-ratio", descriptor=_HP + "importanceRatio",
                                    choices=IMPORTANCE_RATIOS)
    clip_low: float | None = setting(None, "ppo and cispo: the lowest ratio kept (unset: 0.8)", flag="--clip-low",
                                     descriptor=_HP + "clipLow")
    clip_high: float | None = setting(None, "ppo and cispo: the highest ratio kept (unset: 1.2; DAPO's clip-higher "
                                      "raises it alone, e.g. 1.28)", flag="--clip-high", descriptor=_HP + "clipHigh")
    updates_per_batch: int = setting(1, "optimizer passes over each sampled batch; past the first, the ratio is taken "
                                     "against the trainer's logprobs before the first update, so ppo's clip binds",
                                     flag="--updates-per-batch", descriptor=_HP + "updatesPerBatch", metavar="N")
    minibatches: int = setting(1, "optimizer steps each pass makes, each on its share of the batch's datums",
                               flag="--minibatches", descriptor=_HP + "minibatches", metavar="N")
    loss_fn_config: dict = setting(help="loss options, e.g. {'clip_low_threshold': 0.8, 'clip_high_threshold': 1.2}",
                                   factory=dict)
    rollout_correction: str = setting("auto", "tis: truncated importance sampling, each token's advantage times "
                                      "min(p_train / p_sampler, rollout_correction_cap), for the mismatch between "
                                      "the sampler's and the trainer's numbers (bf16, another engine); off; or "
                                      "auto: tis where the run samples its rollouts in bf16 (auto's dtype on "
                                      "hardware with bf16 units), off elsewhere",
                                      flag="--rollout-correction", descriptor="config.rolloutCorrection.mode",
                                      choices=ROLLOUT_CORRECTIONS)
    rollout_correction_cap: float = setting(2.0, "the largest importance weight tis gives a token",
                                            flag="--rollout-correction-cap", descriptor="config.rolloutCorrection.cap")
    system_prompt: str | None = setting(None, "system message before each question (unset: none)",
                                        flag="--system-prompt")
    question_suffix: str = setting("", "text appended to each question", flag="--question-suffix")
    sandbox_graders: bool = setting(True, "run bundle graders confined by the operating system "
                                    "(strop.scoring.sandbox: no network, read-only files, time and memory limits, no "
                                    "secrets); built-in graders always run in-process")
    grader_timeout: float = setting(10.0, "seconds a sandboxed grader call may take before it scores 0 and its "
                                    "processes are killed", descriptor="config.reward.timeoutSeconds")
    grader_memory_mb: int = setting(2048, "memory limit of a grader's processes together where cgroups allow, and of "
                                    "each process's address space in any case, in MiB",
                                    descriptor="config.reward.memoryMb")
    max_reward_error_fraction: float = setting(0.5, "fail the run when more than this fraction of a step's grader "
                                               "calls fail (raise, hang, crash, non-number)",
                                               descriptor="config.reward.maxErrorFraction")
    eval_every: int | None = setting(None, "call the run's evaluation hook every N steps (control-plane runs evaluate "
                                     "on their project's evaluation dataset); unset: never",
                                     descriptor="config.evalEvery")
    sampler: str = setting("auto", "which engine samples the rollouts: strop (its own decoder), vllm (pip install -e "
                           "\".[vllm]\", or STROP_VLLM_PYTHON naming a Python that has it) or auto (vLLM on a CUDA "
                           "GPU where installed, strop's decoder elsewhere, the faster on a CPU; STROP_SAMPLER sets "
                           "what auto means)", flag="--sampler", descriptor="execution.sampler",
                           choices=SAMPLER_CHOICES)
    ray: dict | None = setting(None, 'place sampler replicas and environment workers on a Ray cluster: {"address": '
                               '"auto" | "HOST:PORT", "samplers": N, "envWorkers": N} (strop.cluster; pip install -e '
                               '".[ray]"); unset: everything in this process', descriptor="execution.ray")
    report_rollouts_every: int | None = setting(10, "send a table of the first rollouts of every Nth step (0, N, "
                                                "2N, ...) to the trackers that have tables; unset: no tables",
                                                flag="--report-rollouts-every", metavar="N",
                                                descriptor="execution.reportRolloutsEvery")
    max_off_policy_steps: int = setting(0, "sample up to this many steps ahead while the trainer updates (0: every "
                                        "step samples with the weights it trains): rollouts at most this many "
                                        "updates old, their sampler logprobs correcting the update (importance "
                                        "sampling)", flag="--max-off-policy-steps",
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
            setattr(draft, f.name, values[f.name] if f.name in values else cls.default_of(f.name))
        return draft.field_problems()

    def validate(self) -> list[str]:
        return [f"{name}: {problem}" for name, problem in self.field_problems()]

    def field_problems(self) -> list[tuple[str, str]]:
        # every number within its range (strop.rl.limits), every choice among its values
        p = self.shared_problems()
        if self.rollout_correction == "tis" and self.loss_fn not in POLICY_LOSSES:
            p.append(("rollout_correction", f"tis corrects a policy loss ({', '.join(POLICY_LOSSES)}), not "
                                            f"{self.loss_fn!r}"))
        p.extend(combination_problems(self))
        p.extend(sampling_problems(self))
        p.extend(branching_problems(self))
        if _is_int(self.max_seq_length) and _is_int(self.max_completion_length) \
                and self.max_seq_length <= self.max_completion_length:
            p.append(("max_seq_length", f"must exceed max_completion_length ({self.max_completion_length}) to "
                                        f"leave room for the prompt (got {self.max_seq_length})"))
        if self.sft_mix is not None and not (isinstance(self.sft_mix, str) and _is_file(self.sft_mix)):
            p.append(("sft_mix", f"{str(self.sft_mix)[:200]!r} is not a file; give a supervised .jsonl of chat "
                                 "transcripts, such as `strop envs demos` writes"))
        if self.init_adapter is not None and not (isinstance(self.init_adapter, str)
                                                  and (Path(self.init_adapter) / "adapter_config.json").is_file()):
            p.append(("init_adapter", f"{str(self.init_adapter)[:200]!r} is not a LoRA adapter folder (no "
                                      "adapter_config.json); pass a folder a run wrote, such as its final/"))
        if self.environment is not None:
            env = self.environment
            if not isinstance(env, dict) or not isinstance(env.get("name"), str) \
                    or not isinstance(env.get("options", {}), dict) \
                    or set(env) - {"name", "options", "split", "tasks"}:
                p.append(("environment", f"must be {{'name': ..., 'options': {{...}}, 'split': 'train'}} (and "
                                         f"optionally 'tasks': a pool file or task ids), got {repr(env)[:200]}"))
            elif env.get("tasks") is not None and (problem := task_pool.tasks_problem(env["tasks"])):
                p.append(("environment", f"tasks {problem}"))
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
    def from_dict(cls, data: dict) -> GRPOConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise StropError(f"unknown training config fields {unknown}; known fields: {', '.join(sorted(known))}")
        return cls(**data)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))


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


def _is_file(path: str) -> bool:
    """Whether `path` is a regular file; a path the system cannot even look up (too long, a NUL) is not one."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False
