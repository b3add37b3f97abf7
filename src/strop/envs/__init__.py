"""Multi-turn tool-use environments: the protocol (`base`), the registry of environments by name, and the
environments strop ships.

    from strop.envs import get_env, list_envs
    env = get_env("finance-sql", seed=0)
"""

from __future__ import annotations

from strop.envs.base import Environment, Observation, StepResult, Task, ToolCall

# name -> (module, class, one-line description); loaded on first use
_ENVS = {
    "finance-sql": ("strop.envs.finance_sql", "FinanceSQLEnv",
                    "financial questions answered with SQL over a synthetic company's statements"),
}

__all__ = ["Environment", "Observation", "StepResult", "Task", "ToolCall", "get_env", "list_envs"]


def list_envs() -> list[dict]:
    return [{"name": name, "description": description} for name, (_, _, description) in sorted(_ENVS.items())]


def get_env(name: str, **options) -> Environment:
    """An environment by name with its options (e.g. seed), a user's own as 'package.module:ClassName', or a
    remote OpenEnv environment by URL; a clear error for an unknown name."""
    import importlib

    from strop.errors import StropError
    if name.startswith(("http://", "https://", "ws://", "wss://")):
        from strop.envs.openenv_client import RemoteEnv  # any OpenEnv server, e.g. another `strop envs serve`
        return RemoteEnv(name, **options)
    if ":" in name:
        module, _, cls = name.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)(**options)
        except (ImportError, AttributeError) as exc:
            raise StropError(f"environment {name!r}: cannot load {cls} from {module}: {exc}") from None
    if name not in _ENVS:
        raise StropError(f"no environment {name!r}; the environments are: {', '.join(sorted(_ENVS))} "
                         "(`strop envs list`)")
    module, cls, _ = _ENVS[name]
    return getattr(importlib.import_module(module), cls)(**options)
