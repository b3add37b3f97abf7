"""strop: reinforcement-learning fine-tuning of small open language models on tasks whose answers can be
checked, with the evidence.

Tinker-style primitives, so a loop written for Tinker runs with its imports changed:

    import strop
    from strop import types
    service = strop.ServiceClient()
    training = service.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=32)
    sampler = training.save_weights_and_get_sampling_client(name="step-0")
"""

from strop import types
from strop.client import APIFuture, SamplingClient, ServiceClient, TrainingClient
from strop.errors import StropError

__version__ = "0.1.0"

__all__ = ["APIFuture", "SamplingClient", "ServiceClient", "StropError", "TrainingClient", "types", "__version__"]


def __getattr__(name):
    # `from strop import model_info, renderers` as tinker_cookbook users write it; loaded on first use
    if name in ("model_info", "renderers", "tokenizer_utils", "scoring", "data", "rl", "models"):
        import importlib
        return importlib.import_module(f"strop.{name}")
    raise AttributeError(f"module 'strop' has no attribute {name!r}")
