"""strop's OpenAI-compatible server, driven by the real openai client over loopback, and evaluations of
`openai:NAME@URL` endpoints."""

import json
import re
import threading

import pytest
from openai import OpenAI

from strop.data import Row
from strop.evals.openai_client import evaluate_openai, parse_openai_ref
from strop.errors import StropError
from strop.serve import make_server


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    srv = make_server(str(tiny_model_dir), port=0, name="tiny", api_key="sekret", max_body=4096)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv):
    return f"http://127.0.0.1:{srv.server_port}/v1"


def test_chat_completions_with_the_real_client(server):
    client = OpenAI(base_url=url(server), api_key="sekret", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is 2 + 3?"}],
                                           max_tokens=5, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 5 and reply.usage.prompt_tokens > 0
    again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is 2 + 3?"}],
                                           max_tokens=5, temperature=0)
    assert again.choices[0].message.content == reply.choices[0].message.content  # greedy is repeatable
    many = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, n=3)
    assert len(many.choices) == 3


def test_key_size_and_bad_requests_are_refused(server):
    import openai
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=url(server), api_key="wrong", max_retries=0).models.list()
    client = OpenAI(base_url=url(server), api_key="sekret", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=3)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 5000}], max_tokens=3)
    assert err.value.status_code == 413


def test_evaluate_an_endpoint(server, monkeypatch):
    monkeypatch.setenv("STROP_TEST_KEY", "sekret")
    rows = [Row(question=f"What is {a} + 2?", answer=f"#### {a + 2}") for a in range(4)]
    result = evaluate_openai(f"openai:tiny@{url(server)}", rows, "builtin:gsm8k", max_tokens=4, concurrency=2,
                             api_key_env="STROP_TEST_KEY")
    assert [i.index for i in result.items] == [0, 1, 2, 3] and result.summary["requestErrors"] == 0
    assert all(i.tokens > 0 for i in result.items)
    down = evaluate_openai("openai:tiny@http://127.0.0.1:9/v1", rows[:1], "builtin:gsm8k", max_retries=0, timeout=2)
    assert down.summary["requestErrors"] == 1 and down.items[0].score == 0.0 and "request failed" in down.items[0].error
    with pytest.raises(StropError, match="openai:NAME@URL"):
        parse_openai_ref("openai:no-url")


def test_tools_go_in_and_tool_calls_come_out(server):
    from strop.renderers.tools import hermes_turn
    from strop.serve.requests import tool_reply
    reply, finish = tool_reply('Let me look.<tool_call>{"name": "run_sql", "arguments": {"query": "SELECT 1"}}'
                               '</tool_call>', "stop")
    assert finish == "tool_calls" and reply["content"] == "Let me look."
    assert reply["tool_calls"][0]["function"] == {"name": "run_sql", "arguments": '{"query": "SELECT 1"}'}
    assert tool_reply("just text", "stop") == ({"role": "assistant", "content": "just text"}, "stop")
    back = hermes_turn({"role": "assistant", "content": None, "tool_calls": reply["tool_calls"]})
    assert back["content"] == '<tool_call>{"name": "run_sql", "arguments": {"query": "SELECT 1"}}</tool_call>'
    client = OpenAI(base_url=url(server), api_key="sekret", max_retries=0)
    tools = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object"}}}]
    answer = client.chat.completions.create(model="tiny", max_tokens=4, tools=tools, messages=[
        {"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": reply["tool_calls"]},
        {"role": "tool", "tool_call_id": "x", "content": "1"}])
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    import openai
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "q"}],
                                       tools=[{"type": "function"}])


def test_closing_joins_connection_threads_even_for_an_idle_keep_alive_client(tiny_model_dir):
    # a handler thread left freeing tensors while the interpreter exits aborts the process ("terminate called
    # without an active exception"), so server_close must wait for every connection thread, idle ones included
    import http.client
    import time
    srv = make_server(str(tiny_model_dir), port=0, name="tiny")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "tiny", "max_tokens": 3,
                                                                 "messages": [{"role": "user", "content": "Hi"}]}),
                 headers={"Content-Type": "application/json"})
    assert conn.getresponse().read() and len(srv._live) == 1  # the connection stays open, its thread waits
    threads = list(srv._live)
    srv.shutdown()
    started = time.monotonic()
    srv.server_close()
    assert time.monotonic() - started < 5
    assert not srv._live and not any(t.is_alive() for t in threads)
    conn.close()


def test_generation_in_chunks_gives_what_one_pass_gives(server):
    # strop serve generates in chunks (64, then 256 tokens) so that it can stop for a client that left, and let
    # other clients take turns; greedy text, the first chunk of seeded text, and stop strings across a chunk's edge
    # come out as in one pass
    from strop import types
    from strop.serve.generation import generate
    prompt = server.renderer.build_generation_prompt([{"role": "user", "content": "Tell me a story."}])
    decode, stops = server.renderer.tokenizer.decode, server.renderer.get_stop_sequences()

    def both(**params):
        params = types.SamplingParams(**params)
        whole = server.sampler.sample(prompt=prompt, num_samples=2, sampling_params=params).result().sequences
        return whole, generate(server.sampler, prompt, 2, params, decode, lambda: False)

    whole, chunked = both(max_tokens=200, temperature=0.0, stop=stops)
    assert [s.tokens for s in chunked] == [s.tokens for s in whole] and len(whole[0].tokens) > 64
    assert [s.stop_reason for s in chunked] == [s.stop_reason for s in whole]
    whole, chunked = both(max_tokens=200, temperature=1.0, seed=7, stop=stops)
    assert [s.tokens[:64] for s in chunked] == [s.tokens[:64] for s in whole]
    # the tiny model's greedy text is newlines: 80 of them end it within the second chunk (tokens 64-319),
    # which the engine, seeing only that chunk's 16 or so, cannot tell
    whole, chunked = both(max_tokens=200, temperature=0.0, stop=["\n" * 80])
    assert whole[0].stop_reason == "stop" and 80 <= len(whole[0].tokens) < 128
    assert [(s.tokens, s.stop_reason) for s in chunked] == [(s.tokens, s.stop_reason) for s in whole]
    assert generate(server.sampler, prompt, 2, types.SamplingParams(max_tokens=100), decode, lambda: True) is None


def test_malformed_messages_are_400s_naming_the_field(server):
    """OpenAI's message shapes a client may get wrong (tool_calls, content parts) are refused with 400 and the field,
    through the real client; before, several reached the renderer and came back as 500s. Text parts and arguments
    given as an object still work."""
    import openai
    client = OpenAI(base_url=url(server), api_key="sekret", max_retries=0)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    user = {"role": "user", "content": "q"}
    bad = [([user, {"role": "assistant", "content": "x", "tool_calls": 5}], "messages[1].tool_calls"),
           ([user, {"role": "assistant", "tool_calls": [{"function": "f"}]}], "a tool call must look like"),
           ([user, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}],
            "are not valid JSON"),
           ([{"role": "user", "content": [5]}], "content[0] must be a part"),
           ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], "text only")]
    for messages, expected in bad:
        with pytest.raises(openai.BadRequestError, match=re.escape(expected)):
            client.chat.completions.create(model="tiny", max_tokens=2, messages=messages, tools=tools)
    fine = [{"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                   "function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "1"}]}]
    assert client.chat.completions.create(model="tiny", max_tokens=2, messages=fine, tools=tools).choices


def test_what_openais_clients_send_is_read_as_openai_reads_it(server):
    """A tool conversation without `tools` (null content), a developer turn, a client's stop string that ends
    generation (it was only cut from the text after max_tokens of it), and the refusals OpenAI gives: an unknown
    role, a json_schema that is not an object (was a 500)."""
    import openai
    client = OpenAI(base_url=url(server), api_key="sekret", max_retries=0)
    history = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                    "function": {"name": "w", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert client.chat.completions.create(model="tiny", max_tokens=2, messages=history).choices
    ask = [{"role": "user", "content": "hi"}]
    free = client.chat.completions.create(model="tiny", max_tokens=40, temperature=0, messages=ask)
    text = free.choices[0].message.content
    stop = "\n"                                 # the tiny random model writes newlines early
    assert stop in text and free.usage.completion_tokens == 40, (text, free.usage)
    stopped = client.chat.completions.create(model="tiny", max_tokens=40, temperature=0, messages=ask, stop=stop)
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].message.content
    assert stopped.usage.completion_tokens < 40
    for kwargs, field in (({"messages": [{"role": "bogus", "content": "x"}]}, "role"),
                          ({"messages": ask, "response_format": {"type": "json_schema", "json_schema": "x"}},
                           "json_schema")):
        with pytest.raises(openai.BadRequestError, match=field):
            client.chat.completions.create(model="tiny", max_tokens=2, **kwargs)


def test_logprobs_are_served_in_openais_shape(server):
    """`logprobs` and `top_logprobs` were ignored; now each reply token comes with its logprob and the k likeliest
    tokens at its place, read by the real client into its own types."""
    import math

    import openai
    client = OpenAI(base_url=url(server), api_key="sekret", max_retries=0)
    ask = [{"role": "user", "content": "What is 2 + 3?"}]
    reply = client.chat.completions.create(model="tiny", messages=ask, max_tokens=8, temperature=0, logprobs=True,
                                           top_logprobs=3, n=2)
    for choice in reply.choices:
        content = choice.logprobs.content
        assert "".join(t.token for t in content) == choice.message.content and len(content) == 8
        assert bytes(b for t in content for b in t.bytes).decode() == choice.message.content
        for place in content:
            assert place.logprob <= 0 and len(place.top_logprobs) == 3
            values = [t.logprob for t in place.top_logprobs]
            assert values == sorted(values, reverse=True)
            # greedy: the token taken is the likeliest, with the logprob the teacher-forced pass gives it
            assert place.top_logprobs[0].token == place.token and math.isclose(values[0], place.logprob, abs_tol=1e-3)
    # greedy, as above (8 tokens with no stop): sampled at temperature 1 the random model can end after one token
    plain = client.chat.completions.create(model="tiny", messages=ask, max_tokens=2, temperature=0, logprobs=True)
    assert len(plain.choices[0].logprobs.content) == 2 and plain.choices[0].logprobs.content[0].top_logprobs == []
    assert client.chat.completions.create(model="tiny", messages=ask, max_tokens=2).choices[0].logprobs is None
    for kwargs, says in (({"logprobs": True, "top_logprobs": 21}, "between 0 and 20"),
                         ({"top_logprobs": 2}, "needs \"logprobs\": true"), ({"logprobs": "yes"}, "true or false")):
        with pytest.raises(openai.BadRequestError, match=re.escape(says)):
            client.chat.completions.create(model="tiny", messages=ask, max_tokens=2, **kwargs)


def test_token_bytes_keep_what_a_partial_character_holds(server):
    # an emoji is several byte-level tokens, each alone a replacement character: their bytes still add up to it
    from strop.serve.logprobs import describer, text_tokens
    tokenizer = server.renderer.tokenizer
    text = "\U0001F600 ok"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    describe = describer(tokenizer)
    assert any("\ufffd" in describe(t)[0] for t in tokens)
    assert bytes(b for t in tokens for b in describe(t)[1]) == text.encode()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert describe(end) == ("<|im_end|>", list(b"<|im_end|>"))
    assert text_tokens(tokens + [end], text, tokenizer.decode) == len(tokens)
