"""Supervised fine-tuning: chat transcripts (tool calls included) or prompt/completion pairs, assistant tokens
only (`strop.sft.data`), trained with LoRA by `run_sft` (`strop.sft.loop`).

    from strop.sft import SFTConfig, run_sft
"""

from strop.sft.loop import SFTConfig, SFTResult, run_sft

__all__ = ["SFTConfig", "SFTResult", "run_sft"]
