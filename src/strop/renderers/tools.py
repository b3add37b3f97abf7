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
    """An OpenAI message as the model saw it: its text, and an assistant's tool_calls written back as <tool_call>
    blocks with their arguments as JSON (given as an object or as JSON text, OpenAI's form). The message is one
    that `content_problem` and `tool_call_problem` passed."""
    text = content_text(message.get("content"))
    calls = message.get("tool_calls") or []
    if message.get("role") != "assistant" or not calls:
        return {"role": message["role"], "content": text}
    blocks = [f'<tool_call>{{"name": {json.dumps(c["function"]["name"])}, "arguments": '
              f'{json.dumps(call_arguments(c))}}}</tool_call>' for c in calls]
    return {"role": "assistant", "content": "\n".join(filter(None, [text, *blocks]))}


def content_problem(content) -> str | None:
    """What keeps an OpenAI message's content from being read as text (None: nothing): it may be a string,
    null, or a list of text parts ({"type": "text", "text": "..."})."""
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"content must be a string or a list of text parts, not {type(content).__name__}"
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            return f"content[{j}] must be a part such as {{\"type\": \"text\", \"text\": \"...\"}}"
        kind = part.get("type", "text")
        if kind != "text":
            return f"content[{j}] is a {str(kind)[:40]!r} part; these models read text only"
        if not isinstance(part.get("text"), str):
            return f"content[{j}] is a text part without a string 'text'"
    return None


def content_text(content) -> str:
    """The text of content that `content_problem` passed: a string, or its text parts joined."""
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return content or ""


def tool_call_problem(call) -> str | None:
    """What is wrong with one OpenAI tool call, {"function": {"name": ..., "arguments": ...}} (None: nothing); the
    arguments are an object, or JSON text of one (OpenAI sends text), or absent."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        return 'a tool call must look like {"function": {"name": "...", "arguments": "{...}"}}'
    arguments = function.get("arguments")
    if arguments is None or isinstance(arguments, dict):
        return None
    if not isinstance(arguments, str):
        return f"the arguments of the call to {function['name'][:60]!r} must be an object or JSON text of one"
    if len(arguments) > MAX_CALL_CHARS:
        return f"the arguments of the call to {function['name'][:60]!r} are over {MAX_CALL_CHARS:,} characters"
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, RecursionError):
        return f"the arguments of the call to {function['name'][:60]!r} are not valid JSON: {arguments[:80]}"
    if not isinstance(parsed, dict):
        return f"the arguments of the call to {function['name'][:60]!r} must be a JSON object, not {arguments[:80]}"
    return None


def call_arguments(call: dict) -> dict:
    """The arguments of a call that `tool_call_problem` passed, as an object."""
    arguments = call["function"].get("arguments")
    if isinstance(arguments, str):
        return json.loads(arguments) if arguments.strip() else {}
    return arguments or {}


def tool_name(tool) -> str | None:
    """The name an OpenAI tool schema declares ({"type": "function", "function": {"name": ...}} or the function
    itself), None when it declares none."""
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None
