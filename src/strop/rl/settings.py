"""A training run's settings, each declared once: default, help, the `strop train` flag and the run descriptor's
JSON path, in the field that holds it; its range is `strop.rl.limits.LIMITS[name]`.

    lora_rank: int = setting(32, "LoRA rank", flag="--rank", descriptor="{hp}.lora.rank")

`TrainingSettings` holds what GRPO (`strop.rl.GRPOConfig`) and supervised fine-tuning (`strop.sft.SFTConfig`)
share; each adds its own fields. Every front end reads these declarations instead of repeating them:
`strop train` generates its flags from them (`strop.cli.setting_flags`), the run descriptor is read by their
paths (`descriptor_paths`) and its schema takes their defaults, and the quickstart's options their help. A new
setting is one field here or in its config, plus its range in LIMITS when it is a number.

In a descriptor path, `{hp}` stands for the config's hyperparameter object: `config.rlHyperparams` for GRPO,
`config.sftHyperparams` for supervised runs.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
import typing

from strop.choices import DTYPE_CHOICES
from strop.cluster.settings import RaySettings
from strop.rl.limits import LIMITS
from strop.trackers import CHOICES as TRACKER_CHOICES, DEFAULT as DEFAULT_TRACKERS, parse_report_to, \
    report_to_problems


def setting(default=MISSING, help: str = "", *, factory=None, flag: str | None = None,
            descriptor: str | None = None, choices: tuple | None = None, parse=None, metavar: str | None = None):
    """A dataclass field declaring one setting. `flag` is its `strop train` flag (None: none); `descriptor` the run
    descriptor's path to it (`{hp}` for the hyperparameter object); `choices` the values it takes; `parse` turns
    a flag's text into the value (for lists)."""
    metadata = {"help": help, "flag": flag, "choices": choices, "parse": parse, "metavar": metavar,
                **({"descriptor": "$." + descriptor} if descriptor else {})}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainingSettings:
    """What every training run sets, whatever its method."""

    METHOD: typing.ClassVar[str] = "grpo"                # the descriptor's config.method
    HYPERPARAMS: typing.ClassVar[str] = "rlHyperparams"  # what `{hp}` stands for in a descriptor path

    base_model: str = setting("HuggingFaceTB/SmolLM2-135M-Instruct", "the base model: a catalog id, hub id, local "
                              "HF directory or strop/tiny-random", flag="--base-model", descriptor="baseModel")
    epochs: int = setting(1, "passes over the data when max_steps is not set", flag="--epochs",
                          descriptor="{hp}.epochs")
    max_steps: int | None = setting(None, "the number of steps: the data is reshuffled each pass until it is "
                                    "reached, epochs notwithstanding (unset: `epochs` passes)", flag="--steps",
                                    descriptor="{hp}.maxSteps")
    batch_size: int = setting(8, "prompts (examples) per step", flag="--batch-size", descriptor="{hp}.batchSize")
    learning_rate: float = setting(1e-4, "AdamW learning rate for the LoRA weights", flag="--lr",
                                   descriptor="{hp}.optimizer.learningRate")
    weight_decay: float = setting(0.0, "AdamW weight decay", flag="--weight-decay",
                                  descriptor="{hp}.optimizer.weightDecay")
    grad_clip_norm: float = setting(1.0, "clip the gradient to this global norm (0: no clipping)",
                                    flag="--grad-clip-norm", descriptor="{hp}.optimizer.gradClipNorm")
    lora_rank: int = setting(32, "LoRA rank (an init_adapter brings its own)", flag="--rank",
                             descriptor="{hp}.lora.rank")
    lora_alpha: float | None = setting(None, "LoRA alpha (unset: equal to the rank, a scale of 1)",
                                       flag="--lora-alpha", descriptor="{hp}.lora.alpha")
    init_adapter: str | None = setting(None, "start from this LoRA adapter folder (a supervised warm start's final/, "
                                       "a tuned model's): its weights, rank, alpha and target modules; unset: a fresh "
                                       "adapter", flag="--init-adapter", metavar="DIR")
    save_every: int = setting(10, "checkpoint every N steps (the last step is always saved)", flag="--save-every",
                              descriptor="execution.saveEvery")
    keep_adapters: int = setting(4, "checkpoints to keep", flag="--keep-adapters",
                                 descriptor="execution.keepAdapters")
    seed: int = setting(0, "seed for data order, LoRA init and sampling", flag="--seed")
    renderer: str | None = setting(None, "renderer name (unset: the model's recommended one)")
    dtype: str = setting("auto", "what training and sampling compute in: auto trains in bfloat16 where the hardware "
                         "has bf16 units (a CPU with AVX-512 BF16 or AMX, a CUDA GPU), float32 elsewhere, and samples "
                         "in float32 on a CPU; bfloat16 or float32 set both. LoRA weights, logprobs and losses stay "
                         "float32 (strop.engine.precision); STROP_DTYPE sets what auto means", flag="--dtype",
                         descriptor="execution.dtype", choices=DTYPE_CHOICES)
    gpus: int | None = setting(None, "GPUs the run asks for: 0 computes on the CPU, 1 on a CUDA GPU (on the CPU where "
                               "torch sees none); more need Ray, a data-parallel trainer a GPU; unset: a GPU where "
                               "there is one (strop.engine.precision.run_device)", descriptor="execution.gpus")
    report_to: list = setting(help=f"the experiment trackers the run's metrics, config and sample rollouts go to, "
                              f"from {', '.join(TRACKER_CHOICES)} (each but tensorboard an extra: pip install -e "
                              f"\".[trackers]\"; strop.trackers), or none: metrics.jsonl only",
                              factory=lambda: list(DEFAULT_TRACKERS), flag="--report-to", parse=parse_report_to,
                              metavar="NAME[,NAME...]", descriptor="execution.reportTo")

    def shared_problems(self) -> list[tuple[str, str]]:
        """(field, what is wrong) for every number out of its range (LIMITS), every choice not among its values, and
        the Ray and tracker settings."""
        found = []
        for f in fields(self):
            if f.name in LIMITS:
                problem = LIMITS[f.name].problem(getattr(self, f.name))
                if problem:
                    found.append((f.name, problem))
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                found.append((f.name, f"must be one of {', '.join(choices)}, got {repr(getattr(self, f.name))[:80]}"))
        if self.ray is not None:
            found.extend(("ray", problem) for problem in RaySettings.problems(self.ray))
        found.extend(("report_to", problem) for problem in report_to_problems(self.report_to))
        return found

    @classmethod
    def descriptor_paths(cls) -> dict[str, str]:
        """field -> the JSON path of the run descriptor setting it (`$.config.rlHyperparams.groupSize`)."""
        return {f.name: f.metadata["descriptor"].replace("{hp}", "config." + cls.HYPERPARAMS)
                for f in fields(cls) if "descriptor" in f.metadata}

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}

    @classmethod
    def defaults(cls) -> dict:
        """Every field that has a plain default, by name (what a config saved before the field existed meant)."""
        return {f.name: f.default for f in fields(cls) if f.default is not MISSING}

    @classmethod
    def default_of(cls, name: str):
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default_factory is not MISSING else f.default

    @classmethod
    def flags(cls) -> dict[str, str]:
        """`strop train` flag -> the field it sets."""
        return {f.metadata["flag"]: f.name for f in fields(cls) if f.metadata.get("flag")}
