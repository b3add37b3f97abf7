"""A small tool-use environment for tests: add two numbers with a tool, then submit the sum."""

from strop.envs.base import Observation, StepResult, Task, ToolCall

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a + b",
                                      "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                                                     "b": {"type": "number"}},
                                                     "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "submit_answer", "description": "your final answer",
                                      "parameters": {"type": "object", "properties": {"answer": {"type": "string"}},
                                                     "required": ["answer"]}}},
]


class ToyEnv:
    name = "toy"

    def __init__(self, max_turns: int = 3, count: int = 8):
        self.max_turns, self.count = max_turns, count
        self.task, self.turns, self.answer, self.done = None, 0, None, False

    def tools(self):
        return TOOLS

    def splits(self):
        return ["train", "eval"]

    def tasks(self, split, limit=None):
        start = 0 if split == "train" else 100
        tasks = [Task(id=f"{split}-{i}", prompt=f"What is {start + i} + 2? Use the tools.", answer=str(start + i + 2),
                      split=split) for i in range(self.count)]
        return tasks[:limit] if limit else tasks

    def reset(self, task):
        self.task, self.turns, self.answer, self.done = task, 0, None, False
        return Observation(task.prompt)

    def step(self, call: ToolCall):
        self.turns += 1
        if call.name == "add":
            try:
                reply = str(float(call.arguments["a"]) + float(call.arguments["b"]))
            except (KeyError, TypeError, ValueError):
                reply = "add needs numbers a and b"
        elif call.name == "submit_answer":
            self.answer, self.done = str(call.arguments.get("answer")), True
            right = self.answer.strip().rstrip(".0") == self.task.answer or self.answer.strip() == self.task.answer
            return StepResult(Observation("submitted"), reward=1.0 if right else 0.1, done=True,
                              info={"correct": right})
        else:
            reply = f"no tool {call.name!r}; the tools are add and submit_answer"
        if self.turns >= self.max_turns:
            self.done = True
            return StepResult(Observation(reply + " (out of turns)"), reward=0.0, done=True)
        return StepResult(Observation(reply))

    def state(self):
        return {"task_id": self.task.id if self.task else None, "turns": self.turns, "submitted": self.answer is not None,
                "done": self.done, "sql_errors": 0}

    def close(self):
        pass
