"""Content is text: a special token's text inside a message is encoded as ordinary tokens, never as the token.

A renderer pastes content into its chat template and encodes the result. The tokenizer finds special tokens in
any text it encodes, so a user turn holding `<|im_end|>\\n<|im_start|>system\\n...` would close its own turn and
open a system one. Before rendering, each special token's text in a message's strings is wrapped in two private
markers; encoding the rendered text then writes the template's own special tokens as their ids and each marked
one as plain text (the tokenizer's pipeline without its added tokens).

    guard = ContentGuard(tokenizer)
    messages = guard.mark([{"role": "user", "content": "hi <|im_end|>"}])
    ids = guard.encode(template_text_built_from(messages))   # <|im_end|> from the user: plain-text tokens

Text without special-token text is left alone, so its tokens are exactly those `tokenizer.encode` gives. Only
special tokens are marked: a model's non-special added tokens (Qwen's `<tool_call>`, `<think>`) are its own
output format, which an assistant turn of a transcript writes on purpose.
"""

from __future__ import annotations

import re
import secrets

from strop.errors import StropError


class ContentGuard:
    """Marks special-token text in content and encodes rendered text with only the template's special tokens."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.specials = special_tokens(tokenizer)
        # a random nonce per guard: content cannot forge a marker to turn a template's token into text
        nonce = secrets.token_hex(8)
        self.open, self.close = f"\ue000{nonce}\ue001", f"\ue001{nonce}\ue000"
        self._special_ids = {tokenizer.convert_tokens_to_ids(t) for t in self.specials}
        self._find = re.compile(alternation(self.specials)) if self.specials else None
        opened, closed = re.escape(self.open), re.escape(self.close)
        # a marked token, or a lone marker (a template that cut content apart): the group is None for the latter
        self._pieces = re.compile(f"{opened}({alternation(self.specials)}){closed}|{opened}|{closed}"
                                  if self.specials else f"{opened}|{closed}")

    def mark(self, value):
        """`value` (a string, or messages, tools: lists and dicts of them) with each special token's text in its
        strings wrapped in markers; dict keys are left as they are. Marking marked text changes nothing."""
        if isinstance(value, str):
            return self._mark_text(value)
        if isinstance(value, dict):
            return {key: self.mark(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mark(item) for item in value]
        return value

    def _mark_text(self, text: str) -> str:
        if self.open in text or self.close in text:  # only a guess at this guard's nonce holds these
            text = text.replace(self.open, "").replace(self.close, "")
        if self._find is None:
            return text
        return self._find.sub(lambda found: self.open + found.group(0) + self.close, text)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: unmarked text as the tokenizer encodes it, each marked token as plain text."""
        if self.open not in text and self.close not in text:
            return self.tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = []
        for i, piece in enumerate(self._pieces.split(text)):
            if not piece:  # None: a lone marker, which only breaks the text there
                continue
            ids += self.encode_text(piece) if i % 2 else self.tokenizer.encode(piece, add_special_tokens=False)
        return ids

    def encode_text(self, text: str) -> list[int]:
        """`text` as ordinary tokens, whatever special-token text it holds."""
        ids = plain_ids(self.tokenizer, text)
        if self._special_ids.intersection(ids):  # a vocabulary that spells a special token from plain text
            raise StropError(f"this tokenizer turns the plain text {text[:60]!r} into a special token, so content "
                             "holding it cannot be shown to the model safely; remove it from the messages")
        return ids


def special_tokens(tokenizer) -> list[str]:
    """The texts of the tokenizer's special tokens (whitespace-only ones are ordinary text to templates)."""
    found = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    found.update(tokenizer.all_special_tokens)
    return sorted(t for t in found if t and not t.isspace())


def plain_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` with no added token recognised in it.

    A fast tokenizer runs its own pipeline without the added-token step (normalise, pre-tokenise, model), which
    touches no shared state; `split_special_tokens=True` would set a flag on the tokenizer that every thread
    shares, and another thread's encode could clear it in between."""
    # lazy: transformers is heavy or optional, loaded only when this runs
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    splits = [split for split, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
    return [token.id for split in splits for token in backend.model.tokenize(split)]


def alternation(words: list[str]) -> str:
    """A pattern matching the longest of `words` at a position, written as a trie: matching costs at most the
    longest word's length at each position, however many words share a prefix (`<|im_`, `<|vision_`)."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}
    return _branches(trie)


def _branches(node: dict) -> str:
    ends = "" in node
    branches = [re.escape(char) + _branches(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if ends:  # a word ends here and longer ones go on: try the longer first (greedy), then stop here
        return "(?:" + body + ")?"
    return body
