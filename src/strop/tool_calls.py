"""A tool call as a model makes it: the one type the API surface (renderers parse calls out of replies) and the
environments (which carry them out) share. It lives here, light and alone, so neither layer imports the other.

    ToolCall("run_sql", {"query": "SELECT 1"}, id="call_0")
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict, hash=False)
    id: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments, "id": self.id}
