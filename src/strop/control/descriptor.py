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

import difflib
import json
import re
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from strop.control.descriptor_checks import SHOWN_CHARS, _show, cross_field_problems
from strop.control.descriptor_schema import (  # noqa: F401  (the names every caller imports from here)
    BUILTIN_PREFIX, DescriptorError, EnvironmentSpec, ExecutionSpec, Label, LoraSpec, OptimizerSpec, RaySpec,
    RegistryName, RegistryRef, RewardSpec, RewardTermSpec, RLHyperparams, RolloutCorrectionSpec, RunConfig,
    RunDescriptor, SFTHyperparams, Text, _ABSENT, _at)
from strop.files import FileKindError, open_regular
from strop.sft.config import SFTConfig

MAX_DESCRIPTOR_BYTES = 1 << 20  # a descriptor is a page of JSON; environment options included, 1 MiB is plenty
MAX_DEPTH = 32                  # objects and lists within each other


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


__all__ = ["DescriptorError", "RunDescriptor", "RunConfig", "RLHyperparams", "LoraSpec", "OptimizerSpec",
           "RewardSpec", "RewardTermSpec", "ExecutionSpec", "SFTHyperparams", "validate_descriptor", "load_descriptor",
           "to_sft_config"]
