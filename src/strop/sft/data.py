"""Supervised examples: chat transcripts or prompt/completion pairs, as tokens and a weight per token.

    examples = load_examples("demos.jsonl", renderer, max_seq_length=2048)
    examples[0].tokens, examples[0].weights      # weight 1 on the assistant's tokens, 0 everywhere else

A line of the file is one of:
    {"messages": [{"role": "system" | "user" | "assistant" | "tool", "content": ...}, ...], "tools": [...]}
        OpenAI's chat format: content is a string, null or a list of text parts; an assistant turn may carry
        `tool_calls`, each naming a tool the line declares in `tools`, its arguments an object or JSON text of
        one; a tool result is a `tool` turn; `"weight": 0` on an assistant turn leaves it untrained (OpenAI's
        fine-tuning field). Rendered the way strop's rollouts show the model a conversation (Hermes-style: tools
        described in the system message, calls as <tool_call> blocks with their arguments as JSON, results inside
        <tool_response>), so what the warm start teaches is what GRPO then samples.
    {"prompt": "...", "completion": "..."}
        a user turn and the assistant's reply; or, TRL's conversational form, two lists of messages, of which
        only the completion's assistant turns are trained.

Only the assistant's turns are trained: every token of a system, user or tool turn, and of the headers that
open each turn, has weight 0. A file with a line that cannot be used is refused whole, every problem named by
its line number, before anything is trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from strop import types
from strop.errors import DatasetError
from strop.files import open_regular
from strop.renderers.base import reply_body
from strop.renderers.tools import (content_problem, content_text, hermes_messages, hermes_turn, tool_call_problem,
                                   tool_name)

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


def example_datum(example: Example, scale: float = 1.0) -> types.Datum:
    """The datum of one example: input = tokens[:-1], targets = tokens[1:], each target weighted by its token
    (times `scale`: a supervised loss mixed into another, strop.rl.sft_mix)."""
    tokens = list(example.tokens)
    weights = [w * scale for w in example.weights[1:]]
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:])),
        "weights": types.TensorData.from_torch(torch.tensor(weights, dtype=torch.float32))})


def render_conversation(renderer, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[float]]:
    """Tokens of the conversation and a weight per token: 1 on each assistant turn's body (its text and the
    token that ends the turn), 0 on everything else. Each part is encoded on its own, so the weights fall
    exactly on the assistant's tokens; a special token's text inside any turn is encoded as ordinary text."""
    shown = [hermes_turn(m) for m in messages]
    trained = [m.get("weight", 1) for m in messages if m["role"] == "assistant"]  # OpenAI's weight 0: not trained
    if tools:
        shown = hermes_messages(shown, tools)
    shown = renderer.mark_content(shown)  # special-token text in a turn is trained as text, not as the token
    tokens, weights = [], []
    context = renderer.bos_text()
    for message in shown:
        if message["role"] != "assistant":
            context += renderer.render_turn(message)
            continue
        header = renderer.generation_header("assistant")
        turn = renderer.render_turn(message)
        body = reply_body(turn, header)
        before = renderer.encode(context + header)
        after = renderer.encode(body)
        tokens += before
        weights += [0.0] * len(before)
        tokens += after
        weights += [float(trained.pop(0))] * len(after)
        context = ""
    if context:
        rest = renderer.encode(context)
        tokens += rest
        weights += [0.0] * len(rest)
    return tokens, weights


def line_problems(record, number: int) -> tuple[list[dict] | None, list[dict] | None, list[str]]:
    """(messages, tools, problems) of one line of a supervised file. The messages come back plain: text content,
    and on each assistant turn its `weight` (1 unless the line says 0)."""
    where = f"line {number}"
    if not isinstance(record, dict):
        return None, None, [f"{where}: expected an object with messages (or prompt and completion)"]
    if "messages" not in record:
        return _pair(record, where)
    messages, tools = record["messages"], record.get("tools")
    if not isinstance(messages, list) or not messages:
        return None, None, [f"{where}: messages must be a non-empty list of {{role, content}} objects"]
    declared = set()
    if tools is not None:
        names = [tool_name(t) for t in tools] if isinstance(tools, list) else [None]
        if None in names:
            return None, None, [f"{where}: tools must be a list of OpenAI function schemas, each with a name "
                                '({"type": "function", "function": {"name": "...", "parameters": {...}}})']
        declared = set(names)
    problems = []
    plain = [_message(message, f"{where}, messages[{i}]", declared, problems) for i, message in enumerate(messages)]
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        problems.append(f"{where}: no assistant turn, so nothing to learn from this transcript")
    return (None if problems else plain), tools, problems


def _message(message, at: str, declared: set[str], problems: list[str]) -> dict | None:
    """One message of a transcript as a plain dict, or None with its problems appended."""
    if not isinstance(message, dict):
        problems.append(f"{at}: expected an object with role and content")
        return None
    role = message.get("role")
    if role not in ROLES:
        problems.append(f"{at}: unknown role {str(role)[:40]!r}; the roles are {', '.join(ROLES)}"
                        + (" (OpenAI's developer turn is a system turn here)" if role == "developer" else ""))
        return None
    found = len(problems)
    if (problem := content_problem(message.get("content"))) is not None:
        problems.append(f"{at}: {problem}")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        problems.append(f"{at}: tool_calls must be a list of calls")
        calls = []
    if calls and role != "assistant":
        problems.append(f"{at}: only an assistant turn makes tool calls")
    for call in (calls or []) if role == "assistant" else []:
        if (problem := tool_call_problem(call)) is not None:
            problems.append(f"{at}: {problem}")
        elif (name := call["function"]["name"]) not in declared:
            problems.append(f"{at}: a call to {name[:60]!r}, which the line's tools do not declare"
                            + (f" (declared: {', '.join(sorted(declared))[:300]})" if declared else ""))
    weight = message.get("weight", 1)
    if "weight" in message and (role != "assistant" or isinstance(weight, bool) or weight not in (0, 1)):
        problems.append(f"{at}: weight is 0 or 1 (OpenAI's: whether an assistant turn is trained), and only on an "
                        f"assistant turn; got {str(weight)[:40]!r} on a {role} turn")
    if len(problems) > found:
        return None
    plain = {"role": role, "content": content_text(message.get("content"))}
    if calls:
        plain["tool_calls"] = calls
    if role == "assistant":
        plain["weight"] = int(weight)
    return plain


def _pair(record: dict, where: str) -> tuple[list[dict] | None, None, list[str]]:
    """A prompt/completion line: two strings (a user turn and the reply), or, as TRL's conversational form, two
    lists of messages, where only the completion's assistant turns are trained."""
    prompt, completion = record.get("prompt"), record.get("completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        reply = {"role": "assistant", "content": completion, "weight": 1}
        return [{"role": "user", "content": prompt}, reply], None, []
    if isinstance(prompt, list) and isinstance(completion, list) and prompt and completion:
        problems = []
        shown = [_message(m, f"{where}, prompt[{i}]", set(), problems) for i, m in enumerate(prompt)]
        answer = [_message(m, f"{where}, completion[{i}]", set(), problems) for i, m in enumerate(completion)]
        if not problems and not any(m["role"] == "assistant" for m in answer):
            problems.append(f"{where}: the completion has no assistant turn, so nothing to learn from this line")
        if problems:
            return None, None, problems
        return [{**m, "weight": 0} if m["role"] == "assistant" else m for m in shown] + answer, None, []
    return None, None, [f"{where}: give either messages (a chat transcript) or prompt and completion (two strings, "
                        "or two non-empty lists of messages)"]


def _lines(path: Path):
    """(line number, record or None, problems) of each non-empty line of a supervised .jsonl file."""
    if not path.exists():
        raise DatasetError(f"supervised dataset {path} does not exist: check the path")
    with open_regular(path, what="supervised dataset") as f:
        for number, (raw, size) in enumerate(_bounded_lines(f, MAX_LINE_BYTES), start=1):
            if not raw.strip():
                continue
            if size > MAX_LINE_BYTES:
                yield number, None, [f"line {number}: {size:,} bytes, over the {MAX_LINE_BYTES:,} a transcript "
                                     "may take"]
                continue
            try:
                yield number, json.loads(raw), []
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
                yield number, None, [f"line {number}: not valid JSON ({str(exc)[:80]})"]


def _bounded_lines(f, limit: int):
    """(the line, its length in bytes) of each line of binary file `f`, never more than `limit` + 1 bytes of one
    in memory: a line longer than that is read on to its end and yielded cut, with its whole length."""
    while raw := f.readline(limit + 1):
        size = len(raw)
        while size > limit and not raw.endswith(b"\n"):
            piece = f.readline(1 << 20)
            size += len(piece)
            if not piece or piece.endswith(b"\n"):
                break
        yield raw, size


def _refuse(path: Path, problems: list[str]) -> None:
    if problems:
        more = f"\n  ... and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise DatasetError(f"supervised dataset {path} has {len(problems)} problem{'s' if len(problems) != 1 else ''}:"
                           "\n  " + "\n  ".join(problems[:MAX_PROBLEMS]) + more)


def _says_something(messages: list[dict]) -> bool:
    return any(m["role"] == "assistant" and m["weight"] and (m["content"].strip() or m.get("tool_calls"))
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
