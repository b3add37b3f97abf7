"""Evaluating models in a tool-use environment: an OpenAI-compatible endpoint with native tool calls (a scripted
server on loopback, driven by the real openai client) and a local model through strop's sampler."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from loopback import chat_completion, send_json
from strop.evals.envs import evaluate_env


class _ToolCaller(BaseHTTPRequestHandler):
    """Answers 'What is N + 2?' by calling add, then submit_answer with what add returned: native tool calls."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            call = {"name": "submit_answer", "arguments": json.dumps({"answer": messages[-1]["content"]})}
        else:
            n = int(re.search(r"What is (\d+)", messages[0]["content"]).group(1))
            call = {"name": "add", "arguments": json.dumps({"a": n, "b": 2})}
        tool_calls = [{"id": f"call-{len(messages)}", "type": "function", "function": call}]
        send_json(self, 200, chat_completion(body["model"], {"content": None, "tool_calls": tool_calls}, "tool_calls"))

    def log_message(self, *args):
        pass


def test_an_endpoint_with_native_tool_calls_passes(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ToolCaller)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        report = evaluate_env(f"openai:caller@http://127.0.0.1:{server.server_port}/v1", "toy_env:ToyEnv",
                              splits=["eval"], limit=3, options={"max_turns": 3}, concurrency=1)
    finally:
        server.shutdown()
    split = report["splits"]["eval"]
    assert split["n"] == 3 and split["pass@1"] == 1.0 and split["meanReward"] == 1.0
    assert all(e["turns"] == 2 for e in split["episodes"])
    assert server.requests[0]["tools"][0]["function"]["name"] == "add"  # tools passed natively
    second = server.requests[1]["messages"]
    assert second[1]["tool_calls"][0]["function"]["name"] == "add" and second[2]["role"] == "tool"
    assert split["rubrics"]["submitted"] == 1.0


def test_a_local_model_is_evaluated_per_split(tiny_model_dir):
    report = evaluate_env(str(tiny_model_dir), "toy_env:ToyEnv", limit=2, options={"max_turns": 2}, max_tokens=8)
    assert list(report["splits"]) == ["eval"]  # every split but train by default
    split = report["splits"]["eval"]
    assert split["n"] == 2 and split["pass@1"] == 0.0  # a random model never answers right
    assert split["episodes"][0]["transcript"][0]["content"].startswith("What is 100 + 2?")


def test_a_local_models_episodes_play_in_chunks_with_the_tokens_of_one_batch(tiny_model_dir, monkeypatch):
    """strop's engine plays ENGINE_EPISODES episodes at a time (so that their conversations stay in its prefix
    cache between turns); chunks are seeded as one batch would be, and progress counts every split's episode."""
    from strop.evals import envs
    args = dict(splits=["eval"], limit=5, options={"max_turns": 2}, max_tokens=8, samples=2, temperature=1.0, seed=3)
    whole = evaluate_env(str(tiny_model_dir), "toy_env:ToyEnv", **args)
    monkeypatch.setattr(envs, "ENGINE_EPISODES", 2)
    played = []
    original = envs.play
    monkeypatch.setattr(envs, "play", lambda sampler, renderer, groups, **kw: (
        played.append(sum(len(g) for g in groups)), original(sampler, renderer, groups, **kw))[1])
    progress = []
    chunked = evaluate_env(str(tiny_model_dir), "toy_env:ToyEnv", on_progress=lambda *a: progress.append(a), **args)
    assert played == [2, 2, 1] + [2] * 5  # greedy: 2 tasks a chunk; sampled: one task (2 episodes) a chunk
    assert progress[-1] == ("eval", 5, 5) and [p[1] for p in progress] == sorted(p[1] for p in progress)

    def transcripts(report):
        split = report["splits"]["eval"]
        return [e["transcript"] for e in split["episodes"]], split["samples"]
    assert transcripts(chunked) == transcripts(whole)
