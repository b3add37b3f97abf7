"""Models behind any OpenAI-compatible chat endpoint, named `openai:NAME@URL`, through the real `openai` client.

    ref = parse_openai_ref("openai:gpt-4o-mini@https://api.openai.com/v1")
    result = evaluate_openai("openai:tiny@http://127.0.0.1:8000/v1", rows, "builtin:gsm8k", max_tokens=64)

The key comes from an environment variable (default OPENAI_API_KEY; a local server without a key gets a
placeholder). Requests run `concurrency` at a time; the client retries with backoff (`max_retries`) and gives
each request `timeout` seconds. An item whose request still fails is recorded with its error and scores 0.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from strop.errors import StropError
from strop.evals.runner import EvalItem, EvalResult, _score, summarize
from strop.names import label_problem, shown
from strop.scoring.gsm8k import extract_answer
from strop.scoring.sandbox import grader_for


@dataclass(frozen=True)
class OpenAIRef:
    model: str
    base_url: str


def parse_openai_ref(ref: str) -> OpenAIRef:
    """NAME and base URL of `openai:NAME@URL`; a URL that no client could reach is refused here, not per request."""


    def refuse(problem: str) -> StropError:
        return StropError(f"model {shown(ref)}: {problem}; an endpoint is written openai:NAME@URL, e.g. "
                          "openai:llama3.3-70b@http://127.0.0.1:8000/v1")

    problem = label_problem(ref, max_chars=2048)  # stored with the evaluation and printed in its tables
    if problem:
        raise refuse(problem)
    body = ref[len("openai:"):] if ref.startswith("openai:") else ""
    name, at, url = body.partition("@")
    if not name or not at or not url:
        raise refuse("no model name or no URL")
    if any(c.isspace() for c in url):
        raise refuse(f"the URL {url!r} has a space in it")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise refuse(f"the URL {url!r} must start with http:// or https://")
    if not parts.hostname:
        raise refuse(f"the URL {url!r} names no host")
    try:
        port = parts.port
    except ValueError:  # urllib refuses a port that is not a number or is above 65535
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise refuse(f"the URL {url!r} has a bad port (a number from 1 to 65535)")
    return OpenAIRef(model=name, base_url=url.rstrip("/"))


def client_for(ref: OpenAIRef, *, api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, max_retries: int = 3):
    try:
        # lazy: optional, its absence is handled here
        from openai import OpenAI
    except ImportError:
        raise StropError("OpenAI-compatible endpoints need the openai package: pip install openai") from None
    return OpenAI(base_url=ref.base_url, api_key=os.environ.get(api_key_env) or "unused", timeout=timeout,
                  max_retries=max_retries)


def evaluate_openai(model_ref: str, rows, grader_ref: str, *, max_tokens: int = 256, temperature: float = 0.0,
                    system_prompt: str | None = None, concurrency: int = 4, correct_at: float = 1.0,
                    api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, max_retries: int = 3,
                    on_progress=None):
    ref = parse_openai_ref(model_ref)
    client = client_for(ref, api_key_env=api_key_env, timeout=timeout, max_retries=max_retries)
    with grader_for(grader_ref) as grader:  # bundle code runs sandboxed, as in training
        return _evaluate(client, ref, rows, grader, max_tokens=max_tokens, temperature=temperature,
                         system_prompt=system_prompt, concurrency=concurrency, correct_at=correct_at,
                         on_progress=on_progress)


def _evaluate(client, ref, rows, grader, *, max_tokens, temperature, system_prompt, concurrency, correct_at,
              on_progress):

    def one(index_row):
        index, row = index_row
        messages = row.conversation(system_prompt)
        started = time.perf_counter()
        try:
            reply = client.chat.completions.create(model=ref.model, messages=messages, max_tokens=max_tokens,
                                                   temperature=temperature)
            text = reply.choices[0].message.content or ""
            tokens = getattr(reply.usage, "completion_tokens", 0) or 0
            error = None
        except Exception as exc:  # noqa: BLE001 - after the client's own retries: record, score 0, go on
            text, tokens, error = "", 0, f"request failed: {type(exc).__name__}: {exc}"
        latency = time.perf_counter() - started
        score, grade_error = _score(grader, text, row) if error is None else (0.0, None)
        return EvalItem(index=index, question=row.question, gold=row.gold, response=text, extracted=extract_answer(text),
                        score=score, correct=score >= correct_at, tokens=tokens, latency_s=latency,
                        error=error or grade_error)

    finished = []
    lock = threading.Lock()

    def counted(index_row):
        item = one(index_row)
        with lock:
            finished.append(item.correct)
            if on_progress is not None:
                on_progress(len(finished), len(rows), sum(finished))
        return item

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        items = list(pool.map(counted, enumerate(rows)))
    failed = [i.error for i in items if i.error and i.error.startswith("request failed")]
    # items keep no error column in the store, so the summary carries a few reasons for people to read
    return EvalResult(items=items, summary={**summarize(items), "requestErrors": len(failed),
                                            "requestErrorExamples": list(dict.fromkeys(failed))[:3]})
