"""The control plane: what turns a user's files into admitted, reproducible runs.

    >>> from strop.control import load_descriptor
    >>> run = load_descriptor("run.json")          # DescriptorError lists every problem, one per line
"""

from strop.control.descriptor import (
    DescriptorError,
    ExecutionSpec,
    LoraSpec,
    OptimizerSpec,
    RewardSpec,
    RewardTermSpec,
    RLHyperparams,
    RunConfig,
    RunDescriptor,
    load_descriptor,
    validate_descriptor,
)

__all__ = ["DescriptorError", "RunDescriptor", "RunConfig", "RLHyperparams", "LoraSpec", "OptimizerSpec",
           "RewardSpec", "RewardTermSpec", "ExecutionSpec", "validate_descriptor", "load_descriptor"]
