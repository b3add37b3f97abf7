"""What a renderer is: the bridge between chat messages and the token ids a model reads and writes.

    renderer = renderers.get_renderer("chatml", tokenizer)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 2 + 3?"}])   # ModelInput
    params = SamplingParams(max_tokens=64, stop=renderer.get_stop_sequences())
    message, ok = renderer.parse_response(sampled_tokens)     # ok: the turn ended properly (not cut off)
    text = renderers.get_text_content(message)

A message is a dict with `role` and `content` (a string, or a list of parts with `type: "text"`). Content is
text: a special token's text in it (`<|im_end|>` in a user turn) is encoded as ordinary tokens, so only the
template's own special tokens are special (`strop.renderers.content`).
"""

from __future__ import annotations

import os
from typing import Any

from strop.renderers.content import ContentGuard
from strop.renderers.tools import hermes_messages
from strop.types import ModelInput

Message = dict[str, Any]


def get_text_content(message: Message) -> str:
    """The text of a message whose content is a string or a list of typed parts."""
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type", "text") == "text")


def reply_body(turn: str, header: str) -> str:
    """What a rendered turn holds after the generation header a prompt ends with: all of the header when the turn
    opens with it, else what the two share (qwen3_disable_thinking's header pre-fills an empty think block that
    a turn does not hold; cutting the header's length off the turn cut into its content and, marked content,
    into a marker). The cut falls in template text, never inside content."""
    return turn[len(os.path.commonprefix([turn, header])):]


class Renderer:
    """Subclasses say how one turn looks; this class turns conversations into ModelInputs."""

    name = "base"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._guard: ContentGuard | None = None

    @property
    def guard(self) -> ContentGuard:
        # made on first use: a renderer that only parses replies needs no more of its tokenizer than decode
        if self._guard is None:
            self._guard = ContentGuard(self.tokenizer)
        return self._guard

    # subclasses implement these three
    def render_turn(self, message: Message) -> str:
        raise NotImplementedError

    def generation_header(self, role: str = "assistant") -> str:
        raise NotImplementedError

    def get_stop_sequences(self) -> list[int] | list[str]:
        raise NotImplementedError

    def bos_text(self) -> str:
        return ""

    def mark_content(self, messages: list[Message]) -> list[Message]:
        """`messages` made ready to render: the special-token text in their strings is marked, so `encode`
        writes it as ordinary tokens. Every build_* method does this; call it before render_turn yourself."""
        return self.guard.mark(messages)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: the template's special tokens as their ids, marked content as plain text
        (text rendered from unmarked messages is encoded as the tokenizer does, special tokens and all)."""
        return self.guard.encode(text)

    def build_generation_prompt(self, messages: list[Message], role: str = "assistant",
                                prefill: str | None = None) -> ModelInput:
        messages = self.mark_content(messages)
        text = self.bos_text() + "".join(self.render_turn(m) for m in messages) + self.generation_header(role)
        return ModelInput.from_ints(self.encode(text + self.guard.mark(prefill or "")))

    def build_tool_prompt(self, messages: list[Message], tools: list[dict]) -> ModelInput:
        """A generation prompt for a conversation with tools (role 'tool' turns are tool results): Hermes-style,
        the tools described in the system message and results inside <tool_response>."""
        return self.build_generation_prompt(hermes_messages(messages, tools))

    def build_supervised_example(self, messages: list[Message]) -> tuple[ModelInput, list[float]]:
        """Tokens of the whole conversation and a weight per token: 1 on the last assistant turn, 0 elsewhere."""
        messages = self.mark_content(messages)  # marking is idempotent: build_generation_prompt marks them again
        *context, last = messages
        prompt = self.build_generation_prompt(context, role=last["role"]).to_ints()
        full = self.encode(self.bos_text() + "".join(self.render_turn(m) for m in messages))
        if full[: len(prompt)] != prompt:  # tokenisation merged across the boundary: fall back to concatenation
            full = prompt + self.encode(reply_body(self.render_turn(last), self.generation_header(last["role"])))
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
