"""Graders by reference: built-in ones by name, your own from a directory of Python files (a "bundle").

A grader is any function called as `fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`
that returns a number (usually 0.0 to 1.0). References:

    builtin:gsm8k                  the GSM8K answer grader (`strop.scoring.gsm8k.compute_score`)
    builtin:gsm8k-format           1.0 when the completion marks an answer (`format_score`)
    PATH                           bundle directory; module `reward`, function `compute_score`
    PATH#MODULE                    that module's `compute_score`
    PATH#MODULE:FUNCTION           e.g. `./scoring#reward:compute_score`

    >>> from strop.scoring import load_grader
    >>> grade = load_grader("./scoring#reward:compute_score")
    >>> grade(data_source=None, solution_str="#### 4", ground_truth="4", extra_info={})

A bundle's directory is imported as a package of a private name and its module as a member of it, so modules
import their neighbours relatively (`from .helpers import parse`, also inside a subpackage: `#pkg.reward`); the
directory is also on `sys.path` while it imports, so plain `from helpers import parse` works too. Siblings imported
that second way are then dropped from `sys.modules` so two bundles that both have a `helpers.py` do not see each
other's; import them at module top level, not inside the function.

`strop.scoring.checks` runs the same checks inside the grader sandbox, so a service can vet an uploaded bundle
without importing it into its own process.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import sys
import traceback
from pathlib import Path
from typing import Callable

from strop.errors import BundleError
from strop.scoring import gsm8k

DEFAULT_MODULE = "reward"
DEFAULT_FUNCTION = "compute_score"
GRADER_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
EXPECTED_SIGNATURE = f"{DEFAULT_FUNCTION}(data_source, solution_str, ground_truth, extra_info=None)"
BUILTINS: dict[str, Callable[..., float]] = {
    "gsm8k": gsm8k.compute_score,
    "gsm8k-format": gsm8k.format_score,
}
TRACEBACK_LINES = 8

_counter = itertools.count()


def load_grader(ref: str) -> Callable[..., float]:
    """The grader that `ref` names (see the module docstring); raises BundleError saying what to fix."""
    ref = str(ref).strip()
    if not ref:
        raise BundleError("grader reference is empty: pass 'builtin:gsm8k' or a bundle like "
                          "'./scoring#reward:compute_score'.")
    if ref.startswith("builtin:"):
        name = ref[len("builtin:"):]
        if name not in BUILTINS:
            known = ", ".join(f"builtin:{n}" for n in BUILTINS)
            raise BundleError(f"unknown built-in grader {ref!r}: choose one of {known}.")
        return BUILTINS[name]
    if ref.startswith("bundle:"):
        rest = ref[len("bundle:"):]
        directory, _, _ = split_ref(rest)
        if not Path(directory).expanduser().is_dir():
            raise BundleError(
                f"grader {ref!r} names a registry bundle, and registry bundles need the control plane, which this "
                f"command does not use: pass the bundle's directory instead, e.g. './scoring#reward:compute_score'."
            )
        ref = rest
    directory, module, function = split_ref(ref)
    return load_bundle(directory, module, function)


def absolute_ref(ref: str) -> str:
    """`ref` with a relative bundle directory made absolute, so it names the same folder in a process with another
    working directory (the sandbox's workers run in a temporary one). Built-in graders, registry names and paths
    that are not directories come back unchanged, for load_grader to accept or explain."""
    ref = str(ref).strip()
    if ref.startswith("builtin:"):
        return ref
    prefix = "bundle:" if ref.startswith("bundle:") else ""
    directory, module, function = split_ref(ref[len(prefix):])
    path = Path(directory).expanduser()
    if not path.is_dir():
        return ref
    return f"{prefix}{path.resolve()}#{module}:{function}"


def split_ref(ref: str) -> tuple[str, str, str]:
    """'PATH#MODULE:FUNCTION' -> (PATH, MODULE, FUNCTION), filling in the defaults for omitted parts."""
    # A directory whose name holds '#' is still a plain PATH.
    if "#" not in ref or Path(ref).expanduser().is_dir():
        return ref, DEFAULT_MODULE, DEFAULT_FUNCTION
    directory, _, target = ref.rpartition("#")
    module, _, function = target.partition(":")
    return directory, module.strip() or DEFAULT_MODULE, function.strip() or DEFAULT_FUNCTION


def locate_folder(directory: str | Path, where: str | None = None, module: str | None = None) -> Path:
    """The bundle's resolved folder; BundleError saying what to fix when it is missing or a file."""
    root = Path(directory).expanduser()
    if not root.exists():
        holding = f"holding {module}.py" if module else "of Python modules"
        raise BundleError(f"scoring bundle directory {str(directory)!r} does not exist (in {where or directory!r}): "
                          f"pass a directory {holding}, e.g. './scoring#reward:compute_score'.")
    if not root.is_dir():
        hint = f" Did you mean '{root.parent}#{root.stem}'?" if root.suffix == ".py" else ""
        raise BundleError(f"scoring bundle {str(directory)!r} is a file, not a directory: pass the directory that "
                          f"holds the module and name the module after '#'.{hint}")
    return root.resolve()


def locate(directory: str | Path, module: str = DEFAULT_MODULE, function: str = DEFAULT_FUNCTION) -> tuple[Path, Path]:
    """(the bundle's resolved folder, the module's file), checked without importing anything; BundleError saying
    what to fix when either is missing."""
    where = f"{directory}#{module}:{function}"
    root = locate_folder(directory, where, module)
    if not all(part.isidentifier() for part in module.split(".")):
        raise BundleError(f"scoring bundle module {module!r} (in {where!r}) is not a Python module name: name the .py "
                          f"file without its suffix, e.g. '#reward' for reward.py.")
    file = root.joinpath(*module.split(".")).with_suffix(".py")
    if not file.is_file():
        have = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))
        listing = ", ".join(have[:20]) if have else "no .py files"
        raise BundleError(f"scoring bundle {str(directory)!r} has no module {module!r} ({file.name} not found; the "
                          f"directory has {listing}): name one of those after '#', e.g. '{directory}#NAME:{function}'.")
    return root, file


def load_bundle(
    directory: str | Path, module: str = DEFAULT_MODULE, function: str = DEFAULT_FUNCTION
) -> Callable[..., float]:
    """Import `module` from bundle `directory` and return its checked grader `function`."""
    where = f"{directory}#{module}:{function}"
    root, file = locate(directory, module, function)
    mod = _import(file, root, where)
    if not hasattr(mod, function):
        defined = sorted(n for n, v in vars(mod).items()
                         if inspect.isfunction(v) and v.__module__ == mod.__name__ and not n.startswith("_"))
        listing = ", ".join(defined) if defined else "no public functions"
        raise BundleError(f"module {module!r} in scoring bundle {str(directory)!r} has no function {function!r} (it "
                          f"defines {listing}): name the grader after ':', e.g. '{directory}#{module}:NAME'.")
    fn = getattr(mod, function)
    if not callable(fn):
        raise BundleError(f"{function!r} in {file} is a {type(fn).__name__}, not a function: define "
                          f"`def {EXPECTED_SIGNATURE}:` returning a number.")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        # a call would return a coroutine, not a number: every score would fail, so refuse it up front
        raise BundleError(f"grader {function!r} in {file} is an `async def`; graders are called synchronously and "
                          f"must return a number. Define it with plain `def {EXPECTED_SIGNATURE}:` (run any "
                          f"async work inside it with asyncio.run).")
    problem = signature_problem(fn)
    if problem:
        raise BundleError(f"grader {function!r} in {file} has the wrong signature: {problem}. Define "
                          f"`def {EXPECTED_SIGNATURE}:` (or accept **kwargs).")
    return fn


def signature_problem(fn: Callable) -> str | None:
    """Why `fn` cannot be called with the four grader keyword arguments, or None if it can."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins without introspectable signatures: let the call itself decide
    try:
        sig.bind(**{name: None for name in GRADER_ARGS})
    except TypeError as e:
        name = getattr(fn, "__name__", type(fn).__name__)
        return f"found {name}{sig}, expected {EXPECTED_SIGNATURE} ({e})"
    return None


def _import(file: Path, root: Path, where: str):
    """The module in `file`, imported as a member of the bundle's folder made a package of a private name
    (strop_bundle_N), so a module can import its neighbours relatively too (`from .helpers import x`, in a
    subpackage or at the top); the folder is first on sys.path while it imports, for `from helpers import x`.
    The private package and its members stay in sys.modules (for pickling, and imports made inside a function);
    the folder's modules imported by their own names are dropped, so two bundles' `helpers` never meet."""
    base = f"strop_bundle_{next(_counter)}"
    name = ".".join((base, *file.relative_to(root).with_suffix("").parts))
    hidden = _hide_shadowed(root)
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        _bundle_package(base, root)
        mod = importlib.import_module(name)
    except (Exception, SystemExit) as e:
        for member in [n for n in sys.modules if n == base or n.startswith(base + ".")]:
            del sys.modules[member]
        lines = traceback.format_exception(type(e), e, e.__traceback__)
        tail = "".join(lines).rstrip().splitlines()[-TRACEBACK_LINES:]
        raise BundleError(f"importing {file} (in {where!r}) failed: fix the error below and try again.\n  "
                          + "\n  ".join(tail)) from None
    finally:
        try:
            sys.path.remove(str(root))
        except ValueError:
            pass
        for other in set(sys.modules) - before:
            if not other.startswith(base + ".") and other != base and _inside(sys.modules[other], root):
                del sys.modules[other]
        sys.modules.update(hidden)
    return mod


def _bundle_package(base: str, root: Path) -> None:
    """Register the bundle's folder as package `base`. An __init__.py of the folder itself is not run: the grader's
    module is all a reference names (a folder such as verl's reward_score/ imports every grader and its
    dependencies there); a subpackage's runs, as Python runs it."""
    spec = importlib.machinery.ModuleSpec(base, None, is_package=True)
    spec.submodule_search_locations = [str(root)]
    sys.modules[base] = importlib.util.module_from_spec(spec)


def _inside(module, root: Path) -> bool:
    origin = getattr(module, "__file__", None)
    return bool(origin) and Path(origin).resolve().is_relative_to(root)


def _hide_shadowed(root: Path) -> dict:
    """Take out of sys.modules the already-imported modules that a bundle's own files share a name with.

    Otherwise `from helpers import x` in the bundle would get some other package's `helpers`. Returns them so
    they can be put back. Standard-library names are left alone: hiding `os` mid-import breaks too much, and
    Python itself would not let a script's neighbour shadow an already-imported stdlib module either.
    """
    local = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob("*/__init__.py")}
    hidden = {}
    for name in list(sys.modules):
        top = name.partition(".")[0]
        if top in local and top not in sys.stdlib_module_names and not _inside(sys.modules[name], root):
            hidden[name] = sys.modules.pop(name)
    return hidden
