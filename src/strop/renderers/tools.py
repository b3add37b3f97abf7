"""Tool calls in conversations: Hermes-style `<tool_call>{json}</tool_call>` for models without a native tool
format (the format Qwen's own chat templates use), and parsing what a model wrote back into calls.

    messages = hermes_messages([{"role": "user", "content": question}], tools)   # tools described up front
    calls, problems = parse_tool_calls('<tool_call>{"name": "run_sql", "arguments": {"query": "SELECT 1"}}</tool_call>')
    follow_up = {"role": "tool", "content": "1"}                                  # rendered as a <tool_response>

A call that cannot be parsed becomes a problem string, which the rollout hands back to the model as the
observation ("your tool call was not valid JSON: ..."), never an exception. Parsing takes time linear in the
reply whatever the model wrote: blocks are found with plain string search (no backtracking pattern), a block
over MAX_CALL_CHARS is a problem without being parsed, and JSON nested too deeply is a problem too.
"""

from __future__ import annotations

import json

from strop.tool_calls import ToolCall

OPEN = "<tool_call>"
STOP = "</tool_call>"
MAX_CALL_CHARS = 65_536  # a tool's name and arguments (an SQL query, say); far more is not a call

INSTRUCTIONS = """You have tools. Call one with its name and arguments as JSON inside <tool_call></tool_call> tags, e.g.
<tool_call>{{"name": "{example}", "arguments": {{}}}}</tool_call>
then wait for its result, which comes back inside <tool_response></tool_response>. The tools:
<tools>
{tools}
</tools>"""


def tools_text(tools: list[dict]) -> str:
    example = tools[0]["function"]["name"] if tools else "tool_name"
    listing = "\n".join(json.dumps(t["function"] if "function" in t else t) for t in tools)
    return INSTRUCTIONS.format(example=example, tools=listing)


def hermes_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tools described in the system message and role 'tool' turns as user turns holding
    `<tool_response>`; what any renderer can render."""
    out = []
    system = tools_text(tools)
    if messages and messages[0]["role"] == "system":
        system = messages[0]["content"] + "\n\n" + system
        messages = messages[1:]
    out.append({"role": "system", "content": system})
    for message in messages:
        if message["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
        else:
            out.append(message)
    return out


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """The calls in a model's reply, and a problem line for each `<tool_call>` block that is not a valid call.
    A reply cut at the stop string (no closing tag) still parses."""
    calls, problems = [], []
    for number, body in enumerate(_call_bodies(text or ""), start=1):
        body = body.strip()
        if len(body) > MAX_CALL_CHARS:
            problems.append(f"tool call {number} is {len(body):,} characters, over the {MAX_CALL_CHARS:,} a call may "
                            f"have: {body[:200]}")
            continue
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            problems.append(f"tool call {number} is not valid JSON ({exc.msg} at column {exc.colno}): {body[:200]}")
            continue
        except RecursionError:
            problems.append(f"tool call {number} is JSON nested too deeply to be a call: {body[:200]}")
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            problems.append(f'tool call {number} needs {{"name": "...", "arguments": {{...}}}}, got: {body[:200]}')
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # some models send the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                problems.append(f"tool call {number}: arguments are neither an object nor JSON text: {arguments[:200]}")
                continue
        if not isinstance(arguments, dict):
            problems.append(f"tool call {number}: arguments must be an object, got {type(arguments).__name__}")
            continue
        calls.append(ToolCall(name=data["name"], arguments=arguments, id=f"call-{number}"))
    return calls, problems


def _call_bodies(text: str):
    """The text of each `<tool_call>` block: up to its closing tag, or to the end of a reply cut at the stop string."""
    position = 0
    while (start := text.find(OPEN, position)) >= 0:
        start += len(OPEN)
        end = text.find(STOP, start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        position = end + len(STOP)


def hermes_turn(message: dict) -> dict:
    """An OpenAI message as the model saw it: an assistant's tool_calls written back as <tool_call> blocks."""
    calls = message.get("tool_calls") or []
    if message.get("role") != "assistant" or not calls:
        return {"role": message["role"], "content": message.get("content") or ""}
    blocks = [f'<tool_call>{{"name": {json.dumps(c["function"]["name"])}, "arguments": '
              f'{c["function"].get("arguments") or "{}"}}}</tool_call>' for c in calls]
    return {"role": "assistant", "content": "\n".join(filter(None, [message.get("content") or "", *blocks]))}
