"""The building blocks of the run descriptor's schema (strop.control.descriptor_schema): strict pydantic models
whose every field says what it accepts, the string types a descriptor names things with, and fields whose range
and default come from a training setting's one declaration (strop.rl.limits, strop.rl.settings).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from strop.errors import StropError
from strop.names import label_problem, registry_name_problem, registry_ref_problem
from strop.rl.config import GRPOConfig
from strop.rl.limits import LIMITS


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
