"""What a renderer is: the bridge between chat messages and the token ids a model reads and writes.

    renderer = renderers.get_renderer("chatml", tokenizer)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 2 + 3?"}])   # ModelInput
    params = SamplingParams(max_tokens=64, stop=renderer.get_stop_sequences())
    message, ok = renderer.parse_response(sampled_tokens)     # ok: the turn ended properly (not cut off)
    text = renderers.get_text_content(message)

A message is a dict with `role` and `content` (a string, or a list of parts with `type: "text"`).
"""

from __future__ import annotations

from typing import Any

from strop.renderers.tools import hermes_messages
from strop.types import ModelInput

Message = dict[str, Any]


def get_text_content(message: Message) -> str:
    """The text of a message whose content is a string or a list of typed parts."""
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type", "text") == "text")


class Renderer:
    """Subclasses say how one turn looks; this class turns conversations into ModelInputs."""

    name = "base"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    # subclasses implement these three
    def render_turn(self, message: Message) -> str:
        raise NotImplementedError

    def generation_header(self, role: str = "assistant") -> str:
        raise NotImplementedError

    def get_stop_sequences(self) -> list[int] | list[str]:
        raise NotImplementedError

    def bos_text(self) -> str:
        return ""

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def build_generation_prompt(self, messages: list[Message], role: str = "assistant",
                                prefill: str | None = None) -> ModelInput:
        text = self.bos_text() + "".join(self.render_turn(m) for m in messages) + self.generation_header(role)
        return ModelInput.from_ints(self.encode(text + (prefill or "")))

    def build_tool_prompt(self, messages: list[Message], tools: list[dict]) -> ModelInput:
        """A generation prompt for a conversation with tools (role 'tool' turns are tool results): Hermes-style,
        the tools described in the system message and results inside <tool_response>."""
        return self.build_generation_prompt(hermes_messages(messages, tools))

    def build_supervised_example(self, messages: list[Message]) -> tuple[ModelInput, list[float]]:
        """Tokens of the whole conversation and a weight per token: 1 on the last assistant turn, 0 elsewhere."""
        *context, last = messages
        prompt = self.build_generation_prompt(context, role=last["role"]).to_ints()
        full = self.encode(self.bos_text() + "".join(self.render_turn(m) for m in messages))
        if full[: len(prompt)] != prompt:  # tokenisation merged across the boundary: fall back to concatenation
            full = prompt + self.encode(self.render_turn(last)[len(self.generation_header(last["role"])):])
        weights = [0.0] * len(prompt) + [1.0] * (len(full) - len(prompt))
        return ModelInput.from_ints(full), weights

    def parse_response(self, tokens: list[int]) -> tuple[Message, bool]:
        """The assistant message in sampled tokens; ok is False when the turn never reached a stop sequence."""
        stops = self.get_stop_sequences()
        tokens = list(tokens)
        ok = False
        if stops and isinstance(stops[0], int):
            for i, token in enumerate(tokens):
                if token in stops:
                    tokens, ok = tokens[:i], True
                    break
            text = self.tokenizer.decode(tokens)
        else:
            text = self.tokenizer.decode(tokens)
            cut = min((text.find(s) for s in stops if s in text), default=-1)
            if cut >= 0:
                text, ok = text[:cut], True
        return self.parse_text(text), ok

    def parse_text(self, text: str) -> Message:
        return {"role": "assistant", "content": text}
