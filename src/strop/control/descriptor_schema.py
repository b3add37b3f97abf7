"""The run descriptor's schema: each object of a `run.json` as a strict pydantic model, every field with what it
accepts (said in error messages), its range (strop.rl.limits) and, for a training setting, its default from the
setting's one declaration (strop.rl.settings). `strop.control.descriptor` reads files into it and renders its
errors; `RunDescriptor.to_grpo_config` maps a checked descriptor onto the loop's config by the settings' paths.
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from strop.cluster.settings import ADDRESS_HELP, address_ok
from strop.control.descriptor_fields import (DescriptorError, Label, RegistryName, RegistryRef, Text, _checked, _default,
                                             _field, _limited, _quoted, _setting, _Strict)
from strop.errors import StropError
from strop.names import label_problem, registry_ref_problem
from strop.control.descriptor_checks import cross_field_problems
from strop.engine.losses import POLICY_LOSSES
from strop.choices import DTYPE_CHOICES, SAMPLER_CHOICES
from strop.rl.branching import IDENTICAL_TURNS, REFERENCE_WHEN, SCOUTS
from strop.rl.config import KL_REFERENCES, ROLLOUT_CORRECTIONS, GRPOConfig
from strop.rl.loss_choices import ADVANTAGE_ESTIMATORS, IMPORTANCE_RATIOS, LOSS_AGGREGATIONS, OVERLONG
from strop.scoring.bundles import BUILTINS
from strop.scoring.judge_terms import JUDGE_FORMS, MODES as JUDGE_MODES, judge_form_problem
from strop.sft.config import SFTConfig
from strop.trackers import CHOICES as TRACKER_CHOICES

BUILTIN_PREFIX = "builtin:"
_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$"


class LoraSpec(_Strict):
    rank: int = _setting("lora_rank", required=True)
    alpha: float | None = _setting("lora_alpha")
    target_modules: list[Label] | None = _field(
        None, accepts='a non-empty list of module names such as ["q_proj", "v_proj"], or null (the trainer\'s '
        'default)', item="a module name (a non-empty string)", min_length=1)


class OptimizerSpec(_Strict):
    learning_rate: float = _setting("learning_rate", required=True)
    weight_decay: float = _setting("weight_decay")
    grad_clip_norm: float = _setting("grad_clip_norm", unit="(0: no clipping)")
    warmup_steps: int = _setting("warmup_steps", unit="of steps (0: no warm-up)")


class DynamicSamplingSpec(_Strict):
    # DAPO's dynamic sampling (strop.rl.dynamic_sampling): further tasks until batchSize groups have variance
    enabled: bool = _field(_default("dynamic_sampling"), accepts="true or false")
    max_tasks_per_step: int | None = _setting("max_tasks_per_step")


class SFTMixSpec(_Strict):
    # supervised transcripts whose cross-entropy joins each optimizer step (PPO-ptx; strop.rl.sft_mix)
    data: Annotated[Text, _checked(lambda v: label_problem(v, max_chars=1000))] | None = _field(
        None, accepts='a registered supervised dataset (NAME or NAME@VERSION) or a .jsonl file of chat transcripts '
                      '(strop sft\'s format, e.g. what `strop envs demos` writes), or null: no mix')
    weight: float = _setting("sft_mix_weight")
    examples_per_step: int = _setting("sft_mix_examples")

    @model_validator(mode="after")
    def _data_first(self) -> SFTMixSpec:
        if self.data is None and (self.weight, self.examples_per_step) != (_default("sft_mix_weight"),
                                                                            _default("sft_mix_examples")):
            raise ValueError('weight and examplesPerStep weigh the transcripts in "data": give the file')
        return self


class RLHyperparams(_Strict):
    # maxSteps is the number of steps, the rows reshuffled each pass until it is reached (100 steps of
    # 8 prompts make four passes over 200 rows); without maxSteps, `epochs` passes are made
    epochs: int = _setting("epochs")
    max_steps: int | None = _setting("max_steps")
    group_size: int = _setting("group_size", required=True)
    kl_beta: float = _setting("kl_beta", required=True)
    temperature: float = _setting("temperature", required=True)
    max_completion_length: int = _setting("max_completion_length", required=True)
    batch_size: int = _setting("batch_size")
    lora: LoraSpec
    optimizer: OptimizerSpec
    kl_reference: Literal[KL_REFERENCES] = _field(
        _default("kl_reference"), accepts='"start" (the model the run started from: a tuned baseModel\'s adapter, else the base '
                         'model) or "base" (the base model, adapter off)')
    sft_mix: SFTMixSpec = _field(default_factory=SFTMixSpec, accepts='{"data": "demos.jsonl", "weight": 0.1, '
                                 '"examplesPerStep": 4}: a supervised loss on these transcripts beside the policy\'s')
    variance_on: Label | None = _field(None, accepts="a reward term's name (an environment's: a term its episodes "
                                                     "report, e.g. \"correctness\"), or null for the total reward")
    dynamic_sampling: DynamicSamplingSpec = _field(
        default_factory=DynamicSamplingSpec, accepts='{"enabled": true, "maxTasksPerStep": N}: draw further tasks '
                                                     'until batchSize groups have variance')
    # turn-level credit (strop.rl.branching): a group branched at a turn; turns the whole group wrote alike
    branch_at_turn: int | None = _setting("branch_at_turn")
    scout_temperature: float | None = _setting("scout_temperature")
    scout: Literal[SCOUTS] = _field(_default("scout"), accepts='"policy" (the model plays the turns before the branch) '
                                                             'or "reference" (the environment\'s reference calls)')
    reference_members: int = _setting("reference_members")
    reference_when: Literal[REFERENCE_WHEN] = _field(
        _default("reference_when"), accepts='"always" (every group) or "uninformative" (only a group whose sampled '
                                            'episodes all score alike)')
    identical_turns: Literal[IDENTICAL_TURNS] = _field(
        _default("identical_turns"), accepts='"auto" (skip them where that changes no gradient: klBeta 0), "skip" or "train"')
    # how rewards become an update (strop.rl.loss_choices; docs/training.md, "Loss choices"): each at the
    # behaviour strop had before it by default
    loss_fn: Literal[POLICY_LOSSES] = _field(_default("loss_fn"), accepts=f"one of {_quoted(POLICY_LOSSES)}")
    advantage_estimator: Literal[ADVANTAGE_ESTIMATORS] = _field(
        _default("advantage_estimator"), accepts=f"one of {_quoted(ADVANTAGE_ESTIMATORS)}")
    loss_aggregation: Literal[LOSS_AGGREGATIONS] = _field(_default("loss_aggregation"),
                                                          accepts=f"one of {_quoted(LOSS_AGGREGATIONS)}")
    loss_normalizer: float | None = _setting("loss_normalizer")
    overlong: Literal[OVERLONG] = _field(_default("overlong"), accepts=f"one of {_quoted(OVERLONG)}")
    overlong_buffer: int | None = _setting("overlong_buffer", unit="of tokens")
    importance_ratio: Literal[IMPORTANCE_RATIOS] = _field(_default("importance_ratio"), accepts=f"one of {_quoted(IMPORTANCE_RATIOS)}")
    clip_low: float | None = _setting("clip_low")
    clip_high: float | None = _setting("clip_high")
    updates_per_batch: int = _setting("updates_per_batch")
    minibatches: int = _setting("minibatches")


class SFTHyperparams(_Strict):
    # supervised fine-tuning (method "sft"): maxSteps is the number of steps, the examples reshuffled each pass
    epochs: int = _setting("epochs")
    max_steps: int | None = _setting("max_steps")
    batch_size: int = _setting("batch_size")
    eval_fraction: float = _field(_default("eval_fraction", SFTConfig), accepts="a share from 0 up to (not including) 1 of the examples, held out "
                                               "for the held-out loss", ge=0, lt=1, allow_inf_nan=False)
    lora: LoraSpec
    optimizer: OptimizerSpec


class RewardTermSpec(_Strict):
    kind: Literal["rule", "judge"] = _field(accepts='"rule" (a grader bundle) or "judge" (an LLM judge on a rubric)')
    weight: float = _limited("reward_weight")
    bundle: str | None = _field(None, accepts=f'a registry bundle NAME or NAME@VERSION such as "gsm8k/scoring", or '
                                              f'one of {", ".join(BUILTIN_PREFIX + n for n in BUILTINS)}')
    # kind "judge": the rubric the judge scores each completion on, which judge, and its time per call
    rubric: Label | None = _field(None, accepts="a sentence saying what earns a high score")
    judge: str = _field("local", accepts=JUDGE_FORMS)
    timeout_seconds: float = _field(30.0, accepts="seconds a judge call may take, above 0 and at most 600",
                                    gt=0, le=600, allow_inf_nan=False)
    mode: Literal[JUDGE_MODES] = _field("pointwise", accepts='"pointwise" (each completion alone) or "group" (a '
                                                             "group's completions scored against each other in one "
                                                             "call, RULER-style)")
    module: str = _field("reward", accepts='a Python module name such as "reward"', pattern=_MODULE)
    function: str = _field("compute_score", accepts='a Python function name such as "compute_score"',
                           pattern=_IDENTIFIER)
    name: Label | None = _field(None, accepts="a non-empty string, or null (named after the bundle)")

    @field_validator("judge")
    @classmethod
    def _judge_form(cls, value: str) -> str:
        problem = judge_form_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _kind_needs(self) -> RewardTermSpec:
        if self.kind == "rule" and self.bundle is None:
            raise ValueError('a "rule" term needs a bundle, e.g. "bundle": "builtin:gsm8k"')
        if self.kind == "judge" and self.rubric is None:
            raise ValueError('a "judge" term needs a rubric, e.g. "rubric": "Is the final answer correct?"')
        if self.kind == "judge" and self.bundle is not None:
            raise ValueError('a "judge" term takes no bundle: its judge scores each completion on the rubric')
        if self.kind == "rule" and self.mode != "pointwise":
            raise ValueError('mode is a "judge" term\'s: a "rule" term\'s bundle scores each completion alone')
        return self

    @field_validator("bundle")
    @classmethod
    def _bundle_form(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.startswith(BUILTIN_PREFIX):
            if value[len(BUILTIN_PREFIX):] not in BUILTINS:
                raise ValueError("it is not a built-in grader")
        else:
            problem = registry_ref_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @property
    def is_builtin(self) -> bool:
        return self.bundle is not None and self.bundle.startswith(BUILTIN_PREFIX)

    @property
    def default_name(self) -> str:
        """`name`, else the module when it is not the default `reward` (a bundle of several graders: "format",
        "correctness"), else the bundle's last path segment without its version ("gsm8k/scoring@3" -> "scoring")."""
        if self.name:
            return self.name
        if self.kind == "judge":
            return "judge"
        if self.is_builtin:
            return self.bundle[len(BUILTIN_PREFIX):]
        if self.module != "reward":
            return self.module
        return self.bundle.partition("@")[0].rsplit("/", 1)[-1]

    def grader_ref(self, bundle_dir: str | Path | None = None) -> str:
        """The `load_grader` reference of this term once its bundle is at `bundle_dir` (ignored for builtins)."""
        if self.is_builtin:
            return self.bundle
        if bundle_dir is None:
            raise StropError(f"reward term bundle {self.bundle!r} is a registry reference: pass the directory the "
                             f"registry resolved it to.")
        return f"{bundle_dir}#{self.module}:{self.function}"


class RewardSpec(_Strict):
    terms: list[RewardTermSpec] = _field(accepts="a non-empty list of reward terms", item="a reward term object",
                                         min_length=1)
    # Bundle graders run sandboxed: each call within timeoutSeconds and memoryMb; a step where more than
    # maxErrorFraction of the calls fail stops the run with the first errors.
    max_error_fraction: float = _setting("max_reward_error_fraction")
    timeout_seconds: float = _setting("grader_timeout", unit="of seconds")
    memory_mb: int = _setting("grader_memory_mb", unit="(MiB)")


def _pool_problem(value) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return None  # a file: whether it exists is the run's check, where it runs
    if not isinstance(value, list):
        return None if isinstance(value, str) else "neither a path nor a list"
    if not value:
        return "an empty list names no task"
    return None if all(isinstance(t, str) and t.strip() for t in value) else "every task id is a non-empty string"


class EnvironmentSpec(_Strict):
    name: Annotated[Text, _checked(lambda v: label_problem(v, max_chars=1000))] = _field(
        accepts='an environment name such as "finance-sql" (`strop envs list`), an OpenEnv server URL, or '
                '"module:Class"')
    options: dict[str, Any] = _field(default_factory=dict, accepts='an object of the environment\'s options, e.g. {"seed": 0}')
    split: Label = _field("train", accepts='the split to train on, e.g. "train"')
    tasks: Annotated[Any, _checked(_pool_problem)] = _field(
        None, accepts='the tasks of the split to train on: a pool file (`strop envs eval --pool-out`) or a list of '
                      'task ids')


class RolloutCorrectionSpec(_Strict):
    mode: Literal[ROLLOUT_CORRECTIONS] = _field(_default("rollout_correction"), accepts='"auto" (tis where the rollouts are sampled in bf16), "off", or '
                                                                   '"tis" (truncated importance sampling)')
    cap: float = _setting("rollout_correction_cap")


class RunConfig(_Strict):
    dataset: RegistryRef | None = _field(None, accepts='a registry dataset NAME or NAME@VERSION such as "gsm8k/train" '
                                                      '(or give config.environment instead)')
    environment: EnvironmentSpec | None = _field(None, accepts='{"name": "finance-sql", "options": {...}} for '
                                                               'multi-turn tool use, instead of a dataset')
    method: Literal["grpo", "sft"] = _field(accepts='"grpo", or "sft" (supervised fine-tuning on transcripts)')
    rl_hyperparams: RLHyperparams | None = _field(None, accepts="GRPO's hyperparameters (method grpo)")
    sft_hyperparams: SFTHyperparams | None = _field(None, accepts="supervised fine-tuning's hyperparameters "
                                                                 "(method sft)")
    reward: RewardSpec | None = _field(None, accepts="the reward terms (needed with a dataset; an environment "
                                                     "gives its own reward)")
    # and more than maxCompletionLength: cross_field_problems
    max_seq_length: int = _setting("max_seq_length", required=True)
    eval_every: int | None = _setting("eval_every")  # null: no evaluation during training
    rollout_correction: RolloutCorrectionSpec = _field(
        default_factory=RolloutCorrectionSpec,
        accepts='{"mode": "auto" | "off" | "tis", "cap": 2.0}: weigh each token by min(p_train / p_sampler, cap)')


class RaySpec(_Strict):
    address: Annotated[str, _checked(lambda v: None if address_ok(v) else "a host and a port, joined by ':'")] = _field(
        "auto", accepts=ADDRESS_HELP)
    samplers: int = _limited("ray_samplers", 1)
    env_workers: int = _limited("ray_env_workers", 0)
    trainers: int | None = _limited("ray_trainers", None, optional=True)  # None: execution.gpus when > 1, else 1


class ExecutionSpec(_Strict):
    gpus: int = _limited("gpus")
    save_every: int = _setting("save_every", required=True)
    keep_adapters: int = _setting("keep_adapters", required=True)
    dtype: Literal[DTYPE_CHOICES] = _field(
        _default("dtype"), accepts='"auto" (bfloat16 where the hardware has bf16 units, else float32), "float32" or "bfloat16"')
    sampler: Literal[SAMPLER_CHOICES] = _field(
        _default("sampler"), accepts='"strop" (strop\'s own decoder), "vllm" (vLLM: pip install -e ".[vllm]") or "auto" (vLLM on '
                        'a CUDA GPU where installed, else strop)')
    ray: RaySpec | None = _field(None, accepts='{"address": "auto" | "HOST:PORT", "samplers": N, "envWorkers": N, '
                                              '"trainers": N} to place sampler replicas, environment workers and '
                                              'data-parallel trainers on a Ray cluster (pip install -e ".[ray]"), '
                                              'or null: everything in one process')
    max_off_policy_steps: int = _setting("max_off_policy_steps")
    # the experiment trackers (strop.trackers); whether each is installed is checked when the run is admitted
    report_to: list[Literal[TRACKER_CHOICES]] = _field(
        default_factory=lambda: _default("report_to"), accepts=f"a list of tracker names from "
        f"{', '.join(TRACKER_CHOICES)} (each but tensorboard an extra: pip install -e \".[trackers]\"), or []",
        item=f"one of {', '.join(map(repr, TRACKER_CHOICES))}")
    report_rollouts_every: int | None = _setting("report_rollouts_every")

    @field_validator("report_to")
    @classmethod
    def _each_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("it names a tracker more than once; name each once")
        return value


class RunDescriptor(_Strict):
    kind: Literal["run"] = _field(accepts='"run"')
    project: RegistryName = _field(accepts='a project name such as "gsm8k"')
    config_name: Label = _field(accepts="a config name (a non-empty string)")
    base_model: Label = _field(accepts='a base-model id such as "Qwen/Qwen3-0.6B"')
    config: RunConfig
    execution: ExecutionSpec

    @model_validator(mode="after")
    def _cross_fields(self) -> RunDescriptor:
        # validate_descriptor reports these itself (alongside field errors); this keeps model_validate honest.
        problems = cross_field_problems(self.to_dict())
        if problems:
            raise PydanticCustomError("cross_field", "\n".join(problems))
        return self

    def to_dict(self) -> dict:
        """The descriptor as JSON-ready data with camelCase names and every default filled in."""
        return self.model_dump(by_alias=True, mode="json")

    def term_names(self) -> list[str]:
        """One unique name per reward term, for metrics: `name`, else the bundle's, suffixed when repeated."""
        names: list[str] = []
        for term in (self.config.reward.terms if self.config.reward else []):
            n, base = 1, term.default_name
            while (candidate := base if n == 1 else f"{base}-{n}") in names:
                n += 1
            names.append(candidate)
        return names

    def reward_term_specs(self, grader_refs: list[str]) -> list[dict]:
        """`[{"name", "weight", "grader"}]` for `to_grpo_config`, given each term's resolved grader reference."""
        terms = self.config.reward.terms if self.config.reward else []
        if len(grader_refs) != len(terms):
            raise StropError(f"the descriptor has {len(terms)} reward terms but {len(grader_refs)} grader "
                             f"references were given: resolve each term's bundle once, in order.")
        return [{"name": name, "weight": term.weight, "judge": self._judge_spec(term)} if term.kind == "judge"
                else {"name": name, "weight": term.weight, "grader": ref}
                for name, term, ref in zip(self.term_names(), terms, grader_refs)]

    def _judge_spec(self, term: RewardTermSpec) -> dict:
        """A judge term's entry for `terms_from_spec`; "local" is the run's base model."""
        judge = f"local:{self.base_model}" if term.judge == "local" else term.judge
        return {"rubric": term.rubric, "judge": judge, "timeout": term.timeout_seconds, "mode": term.mode}

    def trainer_ray(self) -> dict | None:
        """execution.ray with its trainers counted: as given, else one a GPU where execution.gpus asks for more
        than one (data-parallel), else one; None without Ray."""
        ray = self.execution.ray
        if ray is None:
            return None
        spec = ray.model_dump(by_alias=True)
        return {**spec, "trainers": spec["trainers"] or max(1, self.execution.gpus)}

    def to_grpo_config(self, dataset: str | None, reward_terms: list[dict], **overrides: Any) -> GRPOConfig:
        """The loop's config: this descriptor's numbers, the resolved dataset path and reward-term specs.

        `overrides` set GRPOConfig fields the descriptor has no place for (seed, system_prompt, ...).
        """
        env = self.config.environment
        data, paths = self.to_dict(), GRPOConfig.descriptor_paths()
        # every setting the descriptor and the loop share, read by its path (GRPOConfig names each field's path:
        # one table, not a copy by hand); a descriptor without reward terms keeps the loop's defaults for them
        values: dict[str, Any] = {name: found for name, path in paths.items()
                                  if (found := _at(data, path)) is not _ABSENT}
        values.update(
            dataset=dataset or "synthetic:add",
            reward_terms=list(reward_terms) or [{"name": "unused", "weight": 1.0, "grader": "builtin:gsm8k"}],
            environment=None if env is None else {"name": env.name, "options": dict(env.options), "split": env.split,
                                                  **({} if env.tasks is None else {"tasks": env.tasks})})
        wrong = sorted(set(overrides) - {f.name for f in dataclass_fields(GRPOConfig)})
        if wrong:
            raise StropError(f"unknown training config overrides {wrong}; known fields: "
                             f"{', '.join(sorted(f.name for f in dataclass_fields(GRPOConfig)))}")
        if values.get("ray") is not None:
            values["ray"] = {**values["ray"], "trainers": self.trainer_ray()["trainers"]}
        values.update(overrides)
        problems = [f"{paths.get(name, name)}: {problem}" for name, problem in GRPOConfig.problems_of(values)]
        if problems:
            raise DescriptorError("run descriptor cannot be run:\n  " + "\n  ".join(problems), problems)
        return GRPOConfig(**values)


_ABSENT = object()


def _at(data: Any, path: str) -> Any:
    """The value at a JSON path like `$.config.rlHyperparams.groupSize` (_ABSENT where a part is missing or null
    on the way)."""
    for key in path.removeprefix("$.").split("."):
        if not isinstance(data, dict) or key not in data:
            return _ABSENT
        data = data[key]
    return data
