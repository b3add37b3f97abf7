"""Renderers: chat messages <-> token ids, stop sequences and response parsing, per model family.

    from strop import model_info, renderers
    from strop.tokenizer_utils import get_tokenizer
    tokenizer = get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(model), tokenizer)

Names: chatml (SmolLM2), qwen3, qwen3_disable_thinking, chat_template (the tokenizer's own template),
role_colon (base models without a template).
"""

from strop.errors import StropError
from strop.renderers.base import Message, Renderer, get_text_content
from strop.renderers.chatml import ChatMLRenderer, Qwen3NoThinkingRenderer, Qwen3Renderer
from strop.renderers.generic import ChatTemplateRenderer, RoleColonRenderer

RENDERERS: dict[str, type[Renderer]] = {
    cls.name: cls for cls in (ChatMLRenderer, Qwen3Renderer, Qwen3NoThinkingRenderer, ChatTemplateRenderer, RoleColonRenderer)
}


def get_renderer(name: str, tokenizer) -> Renderer:
    if name not in RENDERERS:
        raise StropError(f"unknown renderer {name!r}; choose one of {', '.join(RENDERERS)}")
    return RENDERERS[name](tokenizer)


__all__ = ["Message", "Renderer", "RENDERERS", "get_renderer", "get_text_content"]
