"""Renderers for models without a ChatML vocabulary.

`chat_template` defers to the tokenizer's own Jinja chat template (any HF chat model); `role_colon` writes
"User: ...\\n\\nAssistant: ..." for base models with no template at all, stopping at the next "\\n\\nUser:".
"""

from strop.renderers.base import Message, Renderer, get_text_content
from strop.types import ModelInput


class ChatTemplateRenderer(Renderer):
    name = "chat_template"

    def build_generation_prompt(self, messages: list[Message], role: str = "assistant",
                                prefill: str | None = None) -> ModelInput:
        text = self.tokenizer.apply_chat_template(self._plain(messages), tokenize=False,
                                                  add_generation_prompt=role == "assistant")
        return ModelInput.from_ints(self.encode(text + self.guard.mark(prefill or "")))

    def build_tool_prompt(self, messages: list[Message], tools: list[dict]) -> ModelInput:
        """The template's own tool format when it has one (it mentions `tools`), else Hermes-style."""
        template = getattr(self.tokenizer, "chat_template", None) or ""
        if "tools" not in template:
            return super().build_tool_prompt(messages, tools)
        text = self.tokenizer.apply_chat_template(self._plain(messages), tools=self.guard.mark(tools),
                                                  tokenize=False, add_generation_prompt=True)
        return ModelInput.from_ints(self.encode(text))

    def build_supervised_example(self, messages: list[Message]) -> tuple[ModelInput, list[float]]:
        prompt = self.build_generation_prompt(messages[:-1]).to_ints()
        full = self.encode(self.tokenizer.apply_chat_template(self._plain(messages), tokenize=False))
        return ModelInput.from_ints(full), [0.0] * len(prompt) + [1.0] * (len(full) - len(prompt))

    def _plain(self, messages: list[Message]) -> list[Message]:
        """Role and text of each message, special-token text in them marked (the template sees the rest as is)."""
        return self.mark_content([{"role": m["role"], "content": get_text_content(m)} for m in messages])

    def get_stop_sequences(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [eos] if eos is not None else []


class RoleColonRenderer(Renderer):
    name = "role_colon"

    def render_turn(self, message: Message) -> str:
        return f"{message['role'].capitalize()}: {get_text_content(message)}\n\n"

    def generation_header(self, role: str = "assistant") -> str:
        return f"{role.capitalize()}:"

    def get_stop_sequences(self) -> list[str]:
        return ["\n\nUser:"]

    def parse_text(self, text: str) -> Message:
        return {"role": "assistant", "content": text.strip()}
