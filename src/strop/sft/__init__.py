"""Supervised fine-tuning: chat transcripts (tool calls included) or prompt/completion pairs, assistant tokens
only (`strop.sft.data`), trained with LoRA by `run_sft` (`strop.sft.loop`).

    from strop.sft import SFTConfig, run_sft
"""

from strop.sft.config import SFTConfig


def __getattr__(name):
    # the loop pulls in torch, transformers and peft; `strop.sft.data` (checking a transcript file when a dataset is
    # registered) must stay light: a CLI call that registers eight rows took 12 s, 10 of them importing these
    if name in ("SFTResult", "run_sft"):
        from strop.sft import loop  # lazy: torch, transformers and peft, as said above
        return getattr(loop, name)
    raise AttributeError(f"module 'strop.sft' has no attribute {name!r}")


__all__ = ["SFTConfig", "SFTResult", "run_sft"]
