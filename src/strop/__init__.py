"""strop: reinforcement-learning fine-tuning of small open language models on tasks whose answers can be
checked, with the evidence.

Tinker-style primitives, so a loop written for Tinker runs with its imports changed:

    import strop
    from strop import types
    service = strop.ServiceClient()
    training = service.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=32)
    sampler = training.save_weights_and_get_sampling_client(name="step-0")
"""

import importlib

from strop.errors import StropError
from strop.vision_guard import hide_broken_vision_packages

hide_broken_vision_packages()  # before transformers is imported: see strop.vision_guard

__version__ = "0.1.0"

_CLIENT_NAMES = ("APIFuture", "SamplingClient", "ServiceClient", "TrainingClient")
_SUBMODULES = ("types", "model_info", "renderers", "tokenizer_utils", "scoring", "data", "rl", "models", "engine",
               "store", "control", "evals")

__all__ = [*_CLIENT_NAMES, "StropError", "types", "__version__"]


def __getattr__(name):
    # loaded on first use: `import strop.data` must not pay for torch, transformers and peft
    if name in _CLIENT_NAMES:
        return getattr(importlib.import_module("strop.client"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"strop.{name}")
    raise AttributeError(f"module 'strop' has no attribute {name!r}")
