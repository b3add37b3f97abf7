"""Checking a scoring bundle before it is registered or used, inside the grader sandbox: the confinement, limits
and environment a run's graders get, so nothing a bundle runs at import reaches this process, sees its secrets or
outlives the check.

    problem = check_bundle("scoring/", "reward", "compute_score")    # None, or the error a person should see
    modules, problem = check_bundle_folder("scoring/")               # every module that defines compute_score
"""

from __future__ import annotations

from pathlib import Path

from strop.errors import StropError
from strop.scoring.bundles import (DEFAULT_FUNCTION, DEFAULT_MODULE, EXPECTED_SIGNATURE, locate,
                                   locate_folder)
from strop.scoring.sandbox import SandboxError, SandboxPool


def check_bundle(path: str | Path, module: str = DEFAULT_MODULE, function: str = DEFAULT_FUNCTION,
                 *, timeout_s: float = 60.0) -> str | None:
    """Validate a bundle inside the grader sandbox, with the confinement, limits and environment a run's graders
    get: nothing it runs at import reaches this process, sees its secrets or outlives the check.

    Returns the error text a person should see, or None when the bundle loads and its grader's signature fits.
    """
    try:
        root, _ = locate(path, module, function)
        with SandboxPool(workers=1, timeout=timeout_s, import_timeout=timeout_s) as pool:
            pool.call(f"{root}#{module}:{function}", None)
    except SandboxError as exc:
        return _check_problem(exc, path, module, timeout_s)
    except StropError as exc:
        return str(exc)
    return None


def check_bundle_folder(path: str | Path, function: str = DEFAULT_FUNCTION,
                        *, timeout_s: float = 60.0) -> tuple[list[str], str | None]:
    """Every top-level module of a bundle folder that defines `function`, each imported and checked in the sandbox
    (its source is read there too). ([those modules], None), or ([], the error a person should see)."""
    module = None
    try:
        root = locate_folder(path)
        with SandboxPool(workers=1, timeout=timeout_s, import_timeout=timeout_s) as pool:
            found = pool.grader_modules(root, function)
            modules = [name for name, defines in found.items() if defines]
            if not modules and DEFAULT_MODULE in found:
                modules = [DEFAULT_MODULE]  # the conventional grader module: importing it says what is wrong
            if not modules:
                looked = ", ".join(f"{name}.py" for name in found) or "none: it has no .py file at its top level"
                return [], (f"no module in {str(path)!r} defines {function} (the modules looked at: {looked}). "
                            f"Define `def {EXPECTED_SIGNATURE}:` in one of them, or name the module and function "
                            f"to check with --module NAME --function NAME.")
            for module in modules:
                pool.call(f"{root}#{module}:{function}", None)
    except SandboxError as exc:
        return [], (f"module {module!r}: " if module else "") + _check_problem(exc, path, module or "?", timeout_s)
    except StropError as exc:
        return [], str(exc)
    return modules, None


def _check_problem(exc, path, module: str, timeout_s: float) -> str:
    if exc.kind == "timeout":
        return (f"checking scoring bundle {str(path)!r} timed out after {timeout_s:g} s: importing {module}.py "
                f"must not block or do long work at import time; move it into the function or a cache.")
    if exc.kind in ("died", "memory", "channel"):
        return (f"checking scoring bundle {str(path)!r} failed: {exc}; importing {module}.py must not exit, "
                f"crash or write to the standard output's channel.")
    return str(exc)
