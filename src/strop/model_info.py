"""Facts about base models that the rest of strop asks for, starting with which renderer fits.

    from strop import model_info
    model_info.get_recommended_renderer_name("Qwen/Qwen3-0.6B")     # 'qwen3'
"""
from strop.models import CATALOG
from strop.tokenizer_utils import get_tokenizer


def get_recommended_renderer_name(model_name: str) -> str:
    for entry in CATALOG:
        if entry.model_id == model_name:
            return entry.renderer
    lowered = model_name.lower()
    if "qwen3" in lowered:
        return "qwen3"
    if "smollm" in lowered or "qwen" in lowered:
        return "chatml"
    # an unknown model: read its tokenizer to decide
    tokenizer = get_tokenizer(model_name)
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<|im_start|>" in template:
        return "chatml"
    return "chat_template" if template else "role_colon"
