"""The model the KL penalty measures drift from.

    sampler = reference_sampler(service, config)    # None when klBeta is 0

klReference "start" (the default) is the model the run started from: for a run from a tuned model or
`init_adapter` (a supervised warm start's adapter), that adapter, read once into memory when the run begins, so it
stays what the run started from however the files change and whichever checkpoint a resumed run continues from;
for a run from the base model, the base model itself. "base" is the base model with the adapter off: a run from a
warm start is then charged for keeping what the warm start taught (the tool calls the base never makes).
"""

from __future__ import annotations


def reference_sampler(service, config):
    """A sampling client on the KL reference of `config`, or None when `kl_beta` is 0 (nothing to measure)."""
    if not config.kl_beta > 0:
        return None
    start = config.init_adapter if config.kl_reference == "start" else None
    # only the LoRA weights are copied: the base model's weights are the sampler's own, shared
    return service.create_sampling_client(base_model=config.base_model, model_path=start)

