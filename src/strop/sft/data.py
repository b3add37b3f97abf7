"""Supervised examples: chat transcripts or prompt/completion pairs, as tokens and a weight per token.

    examples = load_examples("demos.jsonl", renderer, max_seq_length=2048)
    examples[0].tokens, examples[0].weights      # weight 1 on the assistant's tokens, 0 everywhere else

A line of the file is one of:
    {"messages": [{"role": "system" | "user" | "assistant" | "tool", "content": ...}, ...], "tools": [...]}
        OpenAI's chat format: an assistant turn may carry `tool_calls`, each naming a tool the line declares in
        `tools`; a tool result is a `tool` turn. Rendered the way strop's rollouts show the model a conversation
        (Hermes-style: tools described in the system message, calls as <tool_call> blocks, results inside
        <tool_response>), so what the warm start teaches is what GRPO then samples.
    {"prompt": "...", "completion": "..."}
        a user turn and the assistant's reply.

Only the assistant's turns are trained: every token of a system, user or tool turn, and of the headers that
open each turn, has weight 0. A file with a line that cannot be used is refused whole, every problem named by
its line number, before anything is trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from strop.errors import DatasetError
from strop.files import open_regular
from strop.renderers.tools import hermes_messages, hermes_turn

ROLES = ("system", "user", "assistant", "tool")
MAX_PROBLEMS = 10  # shown of a file's problems; the count says how many more
MAX_LINE_BYTES = 16 << 20  # a transcript is kilobytes; a line past this is refused without being parsed
BYTES_PER_TOKEN = 64  # no token of a chat model's vocabulary is longer: a longer line is over any token budget


@dataclass(frozen=True)
class Example:
    """One training sequence: `weights[i]` says whether `tokens[i]` is trained (the assistant wrote it)."""

    tokens: tuple[int, ...]
    weights: tuple[float, ...]
    line: int

    @property
    def trained(self) -> int:
        return int(sum(self.weights))


def render_conversation(renderer, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[float]]:
    """Tokens of the conversation and a weight per token: 1 on each assistant turn's body (its text and the
    token that ends the turn), 0 on everything else. Each part is encoded on its own, so the weights fall
    exactly on the assistant's tokens."""
    shown = [hermes_turn(m) for m in messages]
    if tools:
        shown = hermes_messages(shown, tools)
    tokens, weights = [], []
    context = renderer.bos_text()
    for message in shown:
        if message["role"] != "assistant":
            context += renderer.render_turn(message)
            continue
        header = renderer.generation_header("assistant")
        turn = renderer.render_turn(message)
        body = turn[len(header):] if turn.startswith(header) else turn
        before = renderer.encode(context + header)
        after = renderer.encode(body)
        tokens += before
        weights += [0.0] * len(before)
        tokens += after
        weights += [1.0] * len(after)
        context = ""
    if context:
        rest = renderer.encode(context)
        tokens += rest
        weights += [0.0] * len(rest)
    return tokens, weights


def line_problems(record, number: int) -> tuple[list[dict] | None, list[dict] | None, list[str]]:
    """(messages, tools, problems) of one line of a supervised file."""
    where = f"line {number}"
    if not isinstance(record, dict):
        return None, None, [f"{where}: expected an object with messages (or prompt and completion)"]
    if "messages" not in record:
        prompt, completion = record.get("prompt"), record.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str):
            return None, None, [f"{where}: give either messages (a chat transcript) or prompt and completion "
                                "(two strings)"]
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], None, []
    messages, tools = record["messages"], record.get("tools")
    if not isinstance(messages, list) or not messages:
        return None, None, [f"{where}: messages must be a non-empty list of {{role, content}} objects"]
    declared = set()
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            return None, None, [f"{where}: tools must be a list of OpenAI function schemas"]
        declared = {(t.get("function") or t).get("name") for t in tools}
    problems = []
    for i, message in enumerate(messages):
        at = f"{where}, messages[{i}]"
        if not isinstance(message, dict):
            problems.append(f"{at}: expected an object with role and content")
            continue
        role = message.get("role")
        if role not in ROLES:
            problems.append(f"{at}: unknown role {str(role)[:40]!r}; the roles are {', '.join(ROLES)}")
            continue
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            problems.append(f"{at}: content must be a string")
        for call in message.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
            if role != "assistant":
                problems.append(f"{at}: only an assistant turn makes tool calls")
            elif not isinstance(name, str):
                problems.append(f"{at}: a tool call needs function.name")
            elif name not in declared:
                problems.append(f"{at}: a call to {name[:60]!r}, which the line's tools do not declare"
                                + (f" (declared: {', '.join(sorted(map(str, declared)))})" if declared else ""))
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        problems.append(f"{where}: no assistant turn, so nothing to learn from this transcript")
    return messages, tools, problems


def _lines(path: Path):
    """(line number, record or None, problems) of each non-empty line of a supervised .jsonl file."""
    if not path.exists():
        raise DatasetError(f"supervised dataset {path} does not exist: check the path")
    with open_regular(path, what="supervised dataset") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if len(raw) > MAX_LINE_BYTES:
                yield number, None, [f"line {number}: {len(raw):,} bytes, over the {MAX_LINE_BYTES:,} a transcript "
                                     "may take"]
                continue
            try:
                yield number, json.loads(raw), []
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                yield number, None, [f"line {number}: not valid JSON ({str(exc)[:80]})"]


def _refuse(path: Path, problems: list[str]) -> None:
    if problems:
        more = f"\n  ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise DatasetError(f"supervised dataset {path} has {len(problems)} problem{'s' if len(problems) != 1 else ''}:"
                           "\n  " + "\n  ".join(problems[:MAX_PROBLEMS]) + more)


def _says_something(messages: list[dict]) -> bool:
    return any(m.get("role") == "assistant" and ((m.get("content") or "").strip() or m.get("tool_calls"))
               for m in messages)


def is_supervised_file(path: str | Path) -> bool:
    """Whether a .jsonl file holds transcripts or prompt/completion pairs (read from its first line)."""
    path = Path(path)
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return False
    for _, record, problems in _lines(path):
        return not problems and isinstance(record, dict) and ("messages" in record or
                                                              {"prompt", "completion"} <= set(record))
    return False


def check_file(path: str | Path) -> int:
    """The number of examples of a supervised file, every line checked (no tokenizer needed); DatasetError naming
    each bad line otherwise."""
    path = Path(path)
    problems, count, said = [], 0, False
    for number, record, found in _lines(path):
        if not found:
            messages, _, found = line_problems(record, number)
            said = said or (not found and _says_something(messages))
        problems += found
        count += not found
    _refuse(path, problems)
    if not count:
        raise DatasetError(f"supervised dataset {path} has no examples")
    if not said:
        raise DatasetError(f"supervised dataset {path}: every assistant turn is empty, so there is nothing to learn "
                           "but ending a turn at once; check the file's assistant contents")
    return count


def load_examples(path: str | Path, renderer, *, max_seq_length: int) -> list[Example]:
    """Every line of a supervised .jsonl file as an Example; DatasetError naming each bad line otherwise."""
    path = Path(path)
    check_file(path)
    examples, problems = [], []
    for number, record, _ in _lines(path):
        messages, tools, _ = line_problems(record, number)
        size = len(json.dumps(record))
        if size > max_seq_length * BYTES_PER_TOKEN:  # over the budget however it tokenizes: not tokenized at all
            problems.append(f"line {number}: {size:,} characters, more than maxSeqLength {max_seq_length:,} tokens "
                            "can hold; raise max_seq_length or shorten the transcript")
            continue
        tokens, weights = render_conversation(renderer, messages, tools)
        if len(tokens) > max_seq_length:
            problems.append(f"line {number}: {len(tokens):,} tokens, over maxSeqLength {max_seq_length:,}; raise "
                            "max_seq_length or shorten the transcript")
            continue
        examples.append(Example(tuple(tokens), tuple(weights), number))
    _refuse(path, problems)
    return examples
