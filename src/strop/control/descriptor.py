"""The run descriptor: the JSON file that says what one training run is (a `run.json`).

A descriptor names a project, a base model, a dataset, the GRPO hyperparameters, the reward terms (scoring
bundles) and how the run is executed. It is checked strictly and as a whole before anything is admitted:
every problem is reported at once, one per line, as a JSON path, what is accepted there and what was given:

    $.config.rlHyperparams.groupSize: must be an integer from 2 to 1,024 (got 1000000000); a step holds every
        completion (batchSize x groupSize) in memory until its update, ...
    $.config.rlHyperparams.optimizer.learningrate: unknown field; known fields here: learningRate, ...
        (did you mean 'learningRate'?)

No silent coercion: "8" is not 8, true is not 1, 8.0 is not an integer. Fields without a default are required.
Every size, count and number has a range, the same one GRPOConfig and `strop train` use (strop.rl.limits); past
its upper end the message says why the limit is there. Names are checked as the registry and the store check
them (strop.names): no '.' or '..' segments, no control or bidirectional characters, at most 200 characters.
The file itself is read only if it is a regular file of at most MAX_DESCRIPTOR_BYTES, nested at most MAX_DEPTH.

    >>> from strop.control import load_descriptor
    >>> run = load_descriptor("examples/gsm8k/run.json")
    >>> run.config.rl_hyperparams.group_size
    8
    >>> refs = [t.grader_ref("/artifacts/bundles/ab12") for t in run.config.reward.terms]  # dirs the registry pinned
    >>> config = run.to_grpo_config("/artifacts/datasets/cd34.jsonl", run.reward_term_specs(refs))

Attributes are snake_case; the JSON's camelCase names are their aliases (`to_dict()` writes them back). Registry
references (`gsm8k/train`, `gsm8k/scoring@3`) are checked for form only: the control plane pins their versions.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import typing
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError,
                      field_validator, model_validator)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from strop.cluster.settings import ADDRESS_HELP, address_ok
from strop.errors import StropError
from strop.files import FileKindError, open_regular
from strop.names import escape_hidden, label_problem, registry_name_problem, registry_ref_problem
from strop.control.descriptor_sampling import branching_problems, loss_choice_problems, sampling_problems
from strop.engine.losses import POLICY_LOSSES
from strop.choices import DTYPE_CHOICES, SAMPLER_CHOICES
from strop.rl.branching import IDENTICAL_TURNS
from strop.rl.config import KL_REFERENCES, ROLLOUT_CORRECTIONS, GRPOConfig
from strop.rl.loss_choices import ADVANTAGE_ESTIMATORS, IMPORTANCE_RATIOS, LOSS_AGGREGATIONS, OVERLONG
from strop.rl.limits import LIMITS
from strop.scoring.bundles import BUILTINS
from strop.scoring.judge_terms import JUDGE_FORMS, judge_form_problem
from strop.sft.config import SFTConfig
from strop.trackers import CHOICES as TRACKER_CHOICES

BUILTIN_PREFIX = "builtin:"
_IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$"
SHOWN_CHARS = 60  # of a given value in a message: enough to recognise it, short enough to stay one line
MAX_DESCRIPTOR_BYTES = 1 << 20  # a descriptor is a page of JSON; environment options included, 1 MiB is plenty
MAX_DEPTH = 32                  # objects and lists within each other


def _checked(check):
    def validate(value: str) -> str:
        problem = check(value)
        if problem:
            raise ValueError(problem)
        return value
    return AfterValidator(validate)


# A string with at least one non-space character: "" and "   " name nothing.
Text = Annotated[str, StringConstraints(min_length=1, pattern=r"\S")]
# A name that is stored and printed: at most 200 characters, no control or bidirectional characters.
Label = Annotated[str, StringConstraints(min_length=1, pattern=r"\S"), _checked(label_problem)]
# A registry name (projects) and a reference to a registered version (datasets): the registry's own rule.
RegistryName = Annotated[str, _checked(registry_name_problem)]
RegistryRef = Annotated[str, _checked(registry_ref_problem)]


class DescriptorError(StropError):
    """A run descriptor that cannot be used; `problems` holds one line per problem (path: what to fix)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


def _field(default: Any = ..., *, accepts: str, item: str | None = None, why: str | None = None,
           why_least: str | None = None, **constraints: Any) -> Any:
    # `accepts` is what the error message says the field takes; `item` the same for one element of a list;
    # `why` is said when a value is past the field's upper limit, `why_least` when it is below the lower one.
    extra = {"accepts": accepts, **({"item": item} if item else {}), **({"why": why} if why else {}),
             **({"why_least": why_least} if why_least else {})}
    return Field(default, json_schema_extra=extra, **constraints)


def _limited(name: str, default: Any = ..., *, unit: str = "", optional: bool = False) -> Any:
    """A field whose range is LIMITS[name], the same one GRPOConfig and `strop train` check."""
    limit = dataclasses.replace(LIMITS[name], optional=optional)
    bounds = {"gt" if limit.least_open else "ge": limit.least, "lt" if limit.most_open else "le": limit.most}
    if not limit.integer:
        bounds["allow_inf_nan"] = False
    return _field(default, accepts=limit.accepts(unit), why=limit.why, why_least=limit.why_least or None, **bounds)


def _setting(name: str, *, required: bool = False, unit: str = "", config: type = GRPOConfig) -> Any:
    """The descriptor field of a run setting: its range LIMITS[name], its default the config's (its one
    declaration, strop.rl.settings); `required` where a descriptor must say it."""
    default = ... if required else config.default_of(name)
    return _limited(name, default, unit=unit, optional=not required and (default is None or LIMITS[name].optional))


def _default(name: str, config: type = GRPOConfig) -> Any:
    """A setting's default, from its one declaration (strop.rl.settings)."""
    return config.default_of(name)


def _quoted(names) -> str:
    return ", ".join(f'"{n}"' for n in names)


class _Strict(BaseModel):
    # strict: no "8" -> 8 or true -> 1; forbid: a misspelt optional field must not be silently ignored.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, alias_generator=to_camel)


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
    variance_on: Label | None = _field(None, accepts="a reward term's name (an environment's: a term its episodes "
                                                     "report, e.g. \"correctness\"), or null for the total reward")
    dynamic_sampling: DynamicSamplingSpec = _field(
        default_factory=DynamicSamplingSpec, accepts='{"enabled": true, "maxTasksPerStep": N}: draw further tasks '
                                                     'until batchSize groups have variance')
    # turn-level credit (strop.rl.branching): a group branched at a turn; turns the whole group wrote alike
    branch_at_turn: int | None = _setting("branch_at_turn")
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


class EnvironmentSpec(_Strict):
    name: Annotated[Text, _checked(lambda v: label_problem(v, max_chars=1000))] = _field(
        accepts='an environment name such as "finance-sql" (`strop envs list`), an OpenEnv server URL, or '
                '"module:Class"')
    options: dict[str, Any] = _field(default_factory=dict, accepts='an object of the environment\'s options, e.g. {"seed": 0}')
    split: Label = _field("train", accepts='the split to train on, e.g. "train"')


class RolloutCorrectionSpec(_Strict):
    mode: Literal[ROLLOUT_CORRECTIONS] = _field(_default("rollout_correction"), accepts='"off", or "tis" (truncated importance sampling)')
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
        accepts='{"mode": "off" | "tis", "cap": 2.0}: weigh each token by min(p_train / p_sampler, cap)')


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
        return {"rubric": term.rubric, "judge": judge, "timeout": term.timeout_seconds}

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
            environment=None if env is None else {"name": env.name, "options": dict(env.options), "split": env.split})
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


# rlHyperparams fields a method-sft descriptor may carry (copied from a GRPO one) that supervised training has no
# use for: admission lists them in the run's pinned `notUsed`, so nothing is dropped unsaid
SAMPLING_ONLY = ("groupSize", "klBeta", "temperature", "maxCompletionLength")


def to_sft_config(descriptor: RunDescriptor, dataset: str, **overrides: Any):
    """The supervised loop's config (strop.sft.SFTConfig) of a method-sft descriptor, `dataset` the local file:
    each setting read by its path, from sftHyperparams, or from rlHyperparams' epochs, maxSteps, batchSize, lora
    and optimizer."""
    hp = "sftHyperparams" if descriptor.config.sft_hyperparams is not None else "rlHyperparams"
    if (descriptor.config.sft_hyperparams or descriptor.config.rl_hyperparams).lora.target_modules is not None:
        raise DescriptorError("run descriptor cannot be run:\n  $.config.*.lora.targetModules: the supervised loop "
                              "adapts every projection; remove it", ["$.config.*.lora.targetModules: remove it"])
    data = descriptor.to_dict()
    values = {name: found for name, path in SFTConfig.descriptor_paths().items()
              if (found := _at(data, path.replace(".sftHyperparams.", f".{hp}."))) is not _ABSENT}
    return SFTConfig(**{**values, "dataset": dataset, "ray": descriptor.trainer_ray(), **overrides})


def _at(data: Any, path: str) -> Any:
    """The value at a JSON path like `$.config.rlHyperparams.groupSize` (_ABSENT where a part is missing or null
    on the way)."""
    for key in path.removeprefix("$.").split("."):
        if not isinstance(data, dict) or key not in data:
            return _ABSENT
        data = data[key]
    return data


# --- validation and its messages -------------------------------------------------------------------------


def validate_descriptor(data: object, *, source: str | None = None) -> RunDescriptor:
    """The checked descriptor, or a DescriptorError listing every problem (`source` names it in the message)."""
    problems: list[str] = []
    depth = _depth(data)
    if depth > MAX_DEPTH:
        where = f" {source}" if source else ""
        problem = (f"$: objects and lists nested more than {MAX_DEPTH} levels deep; a run descriptor has at most "
                   f"{MAX_DEPTH} (environment options included)")
        raise DescriptorError(f"invalid run descriptor{where} (1 problem):\n  {problem}", [problem])
    try:
        descriptor = RunDescriptor.model_validate(data)
    except ValidationError as e:
        descriptor = None
        problems += [_describe(err) for err in e.errors(include_url=False) if err["type"] != "cross_field"]
    problems += duplicate_key_problems(data) + cross_field_problems(data)
    problems = list(dict.fromkeys(problems))  # one report per problem, in order found
    if problems or descriptor is None:
        where = f" {source}" if source else ""
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        raise DescriptorError(f"invalid run descriptor{where} ({count}):\n  " + "\n  ".join(problems), problems)
    return descriptor


def load_descriptor(path: str | Path) -> RunDescriptor:
    """Read and validate a run descriptor file; every way it can be unreadable is a DescriptorError."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DescriptorError(f"run descriptor {path} does not exist: check the path (relative paths start in "
                              f"{Path.cwd()}).")
    if path.is_dir():
        raise DescriptorError(f"run descriptor {path} is a directory: pass the JSON file, e.g. {path / 'run.json'}.")
    try:
        with open_regular(path, what="run descriptor") as f:
            data = f.read(MAX_DESCRIPTOR_BYTES + 1)
    except FileKindError as e:
        raise DescriptorError(f"{e}: pass the JSON file itself.") from None
    except OSError as e:
        raise DescriptorError(f"run descriptor {path} cannot be read: {e.strerror or e}.") from None
    if len(data) > MAX_DESCRIPTOR_BYTES:
        raise DescriptorError(f"run descriptor {path} is over {MAX_DESCRIPTOR_BYTES:,} bytes; a descriptor is a page "
                              f"of JSON (is this the right file?).")
    try:
        text = data.decode("utf-8-sig")  # -sig: editors that write a byte-order mark still work
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DescriptorError(f"run descriptor {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, "
                              f"column {column}): re-save it as UTF-8.") from None
    try:
        value = json.loads(text, object_pairs_hook=_JSONObject.from_pairs)
    except json.JSONDecodeError as e:
        raise DescriptorError(f"run descriptor {path} is not valid JSON: {e.msg} at line {e.lineno}, column "
                              f"{e.colno}.") from None
    except RecursionError:
        raise DescriptorError(f"run descriptor {path} is JSON nested too deeply; a run descriptor has at most "
                              f"{MAX_DEPTH} levels.") from None
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")
        raise DescriptorError(f"run descriptor {path} holds a JSON {kind}; it must be one object like "
                              f'{{"kind": "run", "project": ..., "config": {{...}}, "execution": {{...}}}}.')
    return validate_descriptor(value, source=str(path))


class _JSONObject(dict):
    """A parsed JSON object that remembers keys given twice (json.loads would silently keep the last)."""

    duplicates: dict

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> _JSONObject:
        obj, seen = cls(), {}
        for key, value in pairs:
            seen.setdefault(key, []).append(value)
            obj[key] = value
        obj.duplicates = {k: v for k, v in seen.items() if len(v) > 1}
        return obj


def duplicate_key_problems(data: Any, path: str = "$") -> list[str]:
    problems = []
    if isinstance(data, dict):
        for key, values in getattr(data, "duplicates", {}).items():
            shown = " and ".join(_show(v) for v in values)
            problems.append(f"{_join(path, key)}: given {len(values)} times; give it once (got {shown})")
        for key, value in data.items():
            problems += duplicate_key_problems(value, _join(path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            problems += duplicate_key_problems(value, f"{path}[{i}]")
    return problems


def cross_field_problems(data: Any) -> list[str]:
    """Problems between fields, checked on raw data so they are reported alongside single-field errors."""
    problems = []
    def child(parent: Any, key: str, kind: type) -> Any:
        value = parent.get(key) if isinstance(parent, dict) else None
        return value if isinstance(value, kind) else kind()

    config = child(data, "config", dict)
    hp = child(config, "rlHyperparams", dict)
    problems += sampling_problems(hp) + branching_problems(config) + loss_choice_problems(hp)
    seq, completion = config.get("maxSeqLength"), hp.get("maxCompletionLength")
    in_range = all(_is_int(v, least=0) and LIMITS[name].problem(v) is None
                   for name, v in (("max_seq_length", seq), ("max_completion_length", completion)))
    if in_range and seq <= completion:  # a value out of its own range is reported once, by its field
        problems.append(f"$.config.maxSeqLength: must be greater than $.config.rlHyperparams.maxCompletionLength "
                        f"({completion}) to leave room for the prompt (got {seq})")
    execution = child(data, "execution", dict)
    gpus, trainers = execution.get("gpus"), child(execution, "ray", dict).get("trainers")
    if _is_int(gpus, least=2) and _is_int(trainers, least=1) and trainers != gpus:
        problems.append(f"$.execution.ray.trainers: {trainers} data-parallel trainers, but $.execution.gpus asks "
                        f"for {gpus} (a trainer a GPU); give one of them, or the same number in both")
    method = config.get("method")
    if method == "grpo" and isinstance(data, dict) and "config" in data and config.get("rlHyperparams") is None:
        problems.append("$.config.rlHyperparams: required with method grpo (groupSize, klBeta, temperature, "
                        "maxCompletionLength, lora, optimizer)")
    if method == "sft":
        given = [key for key in ("sftHyperparams", "rlHyperparams") if config.get(key) is not None]
        if not given:
            problems.append("$.config.sftHyperparams: required with method sft (epochs or maxSteps, batchSize, "
                            "lora, optimizer)")
        elif len(given) == 2:
            problems.append("$.config.rlHyperparams: give sftHyperparams or rlHyperparams with method sft, not both")
        for key, what in (("reward", "reward terms"), ("environment", "an environment"),
                          ("evalEvery", "evaluation during training")):
            if config.get(key) is not None:
                problems.append(f"$.config.{key}: method sft takes no {what}; remove it (or use method grpo)")
        if config.get("dataset") is None:
            problems.append("$.config.dataset: method sft needs a registered dataset of chat transcripts or "
                            "prompt/completion pairs")
        return problems
    if method != "grpo" and config.get("sftHyperparams") is not None:
        problems.append("$.config.sftHyperparams: only method sft takes it")
    has_dataset, has_env = config.get("dataset") is not None, config.get("environment") is not None
    if has_dataset == has_env and isinstance(data, dict) and "config" in data:
        problems.append("$.config: give exactly one of dataset (single-turn) and environment (multi-turn tool use)")
    if has_dataset and config.get("reward") is None:
        problems.append("$.config.reward: a run on a dataset needs reward terms, e.g. "
                        '{"terms": [{"kind": "rule", "weight": 1.0, "bundle": "builtin:gsm8k"}]}')
    terms = child(child(config, "reward", dict), "terms", list)
    first_use: dict[str, int] = {}
    for i, term in enumerate(terms):
        name = term.get("name") if isinstance(term, dict) else None
        if isinstance(name, str) and name.strip():
            if name in first_use:
                problems.append(f"$.config.reward.terms[{i}].name: must be unique among the reward terms; "
                                f"terms[{first_use[name]}] is already named {_show(name)}")
            first_use.setdefault(name, i)
    return problems


def _describe(error: dict) -> str:
    loc, kind = tuple(error["loc"]), error["type"]
    path = _path(loc)
    if kind == "extra_forbidden":
        return _unknown_field(loc, path)
    info, model, in_item = _locate(loc)
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    if model is not None and (kind in ("model_type", "model_attributes_type", "dict_type") or "accepts" not in extra):
        accepts = f"an object with fields {_field_list(model)}"
    elif in_item and extra.get("item"):
        accepts = extra["item"]
    elif extra.get("accepts"):
        accepts = extra["accepts"]
    else:  # not expected: every field has an `accepts`; fall back to pydantic's own words
        accepts = error["msg"][0].lower() + error["msg"][1:]
    given = "missing" if kind == "missing" else f"got {_show(error.get('input'))}"
    reason = ""
    if kind == "value_error":  # a check of ours said why: a name's bad segment or character, say
        reason = f"; {error['ctx']['error']}" if error.get("ctx", {}).get("error") else ""
    elif kind in ("less_than_equal", "less_than") and extra.get("why"):
        reason = f"; {extra['why']}"
    elif kind in ("greater_than_equal", "greater_than") and extra.get("why_least"):
        reason = f"; {extra['why_least']}"
    return f"{path}: must be {accepts} ({given}){reason}"


def _unknown_field(loc: tuple, path: str) -> str:
    key = str(loc[-1])
    _, model, _ = _locate(loc[:-1])
    known = [f.alias or name for name, f in model.model_fields.items()] if model else []
    message = f"{path}: unknown field; known fields here: {', '.join(known)}"
    squash = {k.lower().replace("_", "").replace("-", ""): k for k in known}
    close = squash.get(key.lower().replace("_", "").replace("-", "")) or next(
        iter(difflib.get_close_matches(key, known, n=1, cutoff=0.75)), None)
    if close:
        return f"{message} (did you mean {close!r}?)"
    # A right name in the wrong object, e.g. learningRate directly under rlHyperparams.
    elsewhere = [p for p in _all_paths() if p.rsplit(".", 1)[-1].lower() == key.lower()]
    if elsewhere:
        return f"{message} ({key!r} belongs at {elsewhere[0]})"
    return message


def _locate(loc: tuple) -> tuple[Any, type[BaseModel] | None, bool]:
    """For an error location: the last named field's FieldInfo, the model the location ends in, and whether
    it ends inside a list item."""
    annotation: Any = RunDescriptor
    info, in_item = None, False
    for part in loc:
        if isinstance(part, int):
            annotation, in_item = _item_type(annotation), True
            continue
        model = _model_of(annotation)
        found = next((f for name, f in (model.model_fields.items() if model else ())
                      if (f.alias or name) == part), None)
        if found is None:
            return None, None, False
        info, annotation, in_item = found, found.annotation, False
    return info, _model_of(annotation), in_item


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):  # Model or Model | None
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _item_type(annotation: Any) -> Any:
    for candidate in (annotation, *typing.get_args(annotation)):  # list[X] or list[X] | None
        if typing.get_origin(candidate) is list:
            return typing.get_args(candidate)[0]
    return None


def _field_list(model: type[BaseModel]) -> str:
    return ", ".join(f"{f.alias or name}{'' if f.is_required() else ' (optional)'}"
                     for name, f in model.model_fields.items())


def _all_paths(model: type[BaseModel] = RunDescriptor, prefix: str = "$") -> list[str]:
    paths = []
    for name, f in model.model_fields.items():
        path = f"{prefix}.{f.alias or name}"
        paths.append(path)
        inner = _model_of(f.annotation) or _model_of(_item_type(f.annotation))
        if inner:
            paths += _all_paths(inner, path + ("[]" if _item_type(f.annotation) else ""))
    return paths


def _path(loc: tuple) -> str:
    path = "$"
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, part)
    return path


def _join(path: str, key: Any) -> str:
    key = str(key)
    # Keys that are not plain names are quoted so the path still reads unambiguously.
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,99}", key):
        return f"{path}.{key}"
    quoted = json.dumps(key)  # ASCII, so a control or bidirectional character shows as its escape
    return f"{path}[{quoted if len(quoted) <= SHOWN_CHARS else quoted[:SHOWN_CHARS - 4] + '...' + quoted[-1]}]"


def _show(value: Any) -> str:
    """A given value as the person wrote it in JSON ("8" stays quoted, True is true), shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    text = text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."
    return escape_hidden(text)  # a bidirectional override or an escape sequence is never printed raw


def _depth(value: Any) -> int:
    """How deeply objects and lists nest in `value` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:  # deeper is refused anyway: no need to walk on
                stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _is_int(value: Any, *, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


__all__ = ["DescriptorError", "RunDescriptor", "RunConfig", "RLHyperparams", "LoraSpec", "OptimizerSpec",
           "RewardSpec", "RewardTermSpec", "ExecutionSpec", "SFTHyperparams", "validate_descriptor", "load_descriptor",
           "to_sft_config"]
