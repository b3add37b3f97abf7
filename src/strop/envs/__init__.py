"""Multi-turn tool-use environments: the protocol (`base`), the registry of environments by name, and the
environments strop ships.

    from strop.envs import get_env, list_envs
    env = get_env("finance-sql", seed=0)

An environment name is one of three things, and nothing else:
- a registered environment ("finance-sql"; `strop envs list`),
- an OpenEnv server's URL ("http://127.0.0.1:8000"),
- "package.module:ClassName", a class with the Environment methods (tools, tasks, splits, reset, step, state,
  close). It is checked to be one before it is instantiated: "os:system" is refused and nothing is called.

`env_kind` and `find_env_module` read a name without importing anything, for checks that must run no code from
a module a person named (`strop runs start --dry-run`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import re

from strop.envs.base import Environment, Observation, StepResult, Task, ToolCall
from strop.errors import StropError
from strop.names import label_problem, shown

# name -> (module, class, one-line description); loaded on first use
_ENVS = {
    "finance-sql": ("strop.envs.finance_sql", "FinanceSQLEnv",
                    "financial questions answered with SQL over a synthetic company's statements"),
}
URL_PREFIXES = ("http://", "https://", "ws://", "wss://")
# What issubclass(cls, Environment) would check if Environment (a Protocol with data members, name and
# max_turns, which issubclass refuses) allowed it: the methods, present on the class before any instance exists.
ENVIRONMENT_METHODS = ("tools", "tasks", "splits", "reset", "step", "state", "close")
_CLASS_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME_CHARS = 1000  # a URL or module path; longer is not a name

__all__ = ["Environment", "Observation", "StepResult", "Task", "ToolCall", "get_env", "list_envs", "env_kind",
           "find_env_module"]


def list_envs() -> list[dict]:
    return [{"name": name, "description": description} for name, (_, _, description) in sorted(_ENVS.items())]


def accepted() -> str:
    return (f"a registered environment ({', '.join(sorted(_ENVS))}; `strop envs list`), an OpenEnv server's URL "
            "(e.g. http://127.0.0.1:8000), or 'package.module:ClassName' naming a class with the Environment methods "
            f"({', '.join(ENVIRONMENT_METHODS)})")


def env_kind(name: str) -> str:
    """'registered', 'url' or 'class', read from the name alone (nothing is imported); StropError for anything
    else, saying what is accepted."""
    problem = label_problem(name, max_chars=MAX_NAME_CHARS)
    if problem:
        raise StropError(f"environment name {shown(name)} is not allowed: {problem}; name {accepted()}")
    if name.startswith(URL_PREFIXES):
        return "url"
    if name in _ENVS:
        return "registered"
    if ":" in name:
        if not _CLASS_REF.fullmatch(name):
            raise StropError(f"environment {shown(name)} is not an environment name: name {accepted()}")
        return "class"
    raise StropError(f"no environment {shown(name)}; name {accepted()}")


def find_env_module(name: str) -> str:
    """Where the module of a 'package.module:ClassName' environment would be imported from, found without
    running any of it (not even its packages' __init__); StropError when it is not on the Python path."""
    if env_kind(name) != "class":
        raise StropError(f"environment {shown(name)} is not a 'package.module:ClassName' name")
    module = name.partition(":")[0]
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name: finders only, its code is not run
        for i in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                break
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), spec.submodule_search_locations)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise StropError(f"environment {shown(name)}: no module named {module!r} on the Python path (set PYTHONPATH "
                         f"to the folder that holds it; the run's worker needs it too); or name {accepted()}")
    if spec.has_location and spec.origin:
        return spec.origin
    return f"Python's own {module}" if spec.origin in ("built-in", "frozen") else f"the namespace package {module}"


def get_env(name: str, **options) -> Environment:
    """An environment by name with its options (e.g. seed), a user's own as 'package.module:ClassName', or a
    remote OpenEnv environment by URL; a clear error for anything else, before anything is called."""
    kind = env_kind(name)
    if kind == "url":
        from strop.envs.openenv_client import RemoteEnv  # any OpenEnv server, e.g. another `strop envs serve`
        return RemoteEnv(name, **options)
    if kind == "registered":
        module, cls, _ = _ENVS[name]
        return getattr(importlib.import_module(module), cls)(**options)
    cls = load_env_class(name)
    _check_options(name, cls, options)
    return cls(**options)


def _check_options(name: str, cls: type, options: dict) -> None:
    # a user's class that does not take an option strop passes (seed, most often) would otherwise end in a
    # TypeError traceback from its constructor
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # a signature Python cannot read: let the call itself say
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    taken = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                    inspect.Parameter.KEYWORD_ONLY)}
    refused = [k for k in options if k not in taken]
    if refused:
        listed = ", ".join(repr(k) for k in refused)
        raise StropError(f"environment {shown(name)}: its constructor takes no {listed} option, which strop passes "
                         f"(seed from --seed or the run's environment options); give {cls.__name__}.__init__ a "
                         f"parameter for each (e.g. `def __init__(self, seed: int = 0, **options)`)")


def load_env_class(name: str) -> type:
    """The class a 'package.module:ClassName' name refers to, after checking it is an environment class."""
    if env_kind(name) != "class":
        raise StropError(f"environment {shown(name)} is not a 'package.module:ClassName' name")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise StropError(f"environment {shown(name)}: no module named {module_name!r} on the Python path (set "
                             f"PYTHONPATH to the folder that holds it); or name {accepted()}") from None
        raise StropError(f"environment {shown(name)}: importing {module_name} failed: {exc}") from None
    except Exception as exc:  # the module's own code raised: say so, rather than a traceback
        raise StropError(f"environment {shown(name)}: importing {module_name} failed: "
                         f"{type(exc).__name__}: {exc}") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise StropError(f"environment {shown(name)}: {module_name} has no {attr}; name {accepted()}")
    if not inspect.isclass(obj):
        what = ("a built-in function" if inspect.isbuiltin(obj) else "a function" if inspect.isfunction(obj)
                else "a module" if inspect.ismodule(obj) else f"a {type(obj).__name__} value")
        raise StropError(f"environment {shown(name)}: {module_name}.{attr} is not an environment class (it is "
                         f"{what}), so it is not called; name {accepted()}")
    missing = [m for m in ENVIRONMENT_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise StropError(f"environment {shown(name)}: {module_name}.{attr} is not an environment class (it has no "
                         f"{', '.join(missing)}), so it is not instantiated; name {accepted()}")
    return obj
