"""ChatML, the turn format of SmolLM2 and Qwen: `<|im_start|>role\\ncontent<|im_end|>\\n`.

Qwen3 adds thinking: a reply may open with `<think>...</think>`; `qwen3` keeps it in the text it parses out
(under `thinking`), `qwen3_disable_thinking` pre-fills an empty think block so the model answers directly.
"""

import re

from strop.renderers.base import Message, Renderer, get_text_content

THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


class ChatMLRenderer(Renderer):
    name = "chatml"

    def render_turn(self, message: Message) -> str:
        return f"<|im_start|>{message['role']}\n{get_text_content(message)}<|im_end|>\n"

    def generation_header(self, role: str = "assistant") -> str:
        return f"<|im_start|>{role}\n"

    def get_stop_sequences(self) -> list[int]:
        token = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if token is None or token == self.tokenizer.unk_token_id:
            raise ValueError("this tokenizer has no <|im_end|> token, so it does not speak ChatML; "
                             "use the 'chat_template' or 'role_colon' renderer")
        return [token]


class Qwen3Renderer(ChatMLRenderer):
    name = "qwen3"

    def parse_text(self, text: str) -> Message:
        match = THINK.match(text)
        if match:
            return {"role": "assistant", "content": text[match.end():], "thinking": match.group(1).strip()}
        return {"role": "assistant", "content": text}


class Qwen3NoThinkingRenderer(Qwen3Renderer):
    name = "qwen3_disable_thinking"

    def generation_header(self, role: str = "assistant") -> str:
        header = super().generation_header(role)
        return header + "<think>\n\n</think>\n\n" if role == "assistant" else header
