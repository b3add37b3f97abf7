"""Renderers: prompts as the chat template writes them, stop sequences, response parsing."""

import pytest

from strop import model_info, renderers
from strop.errors import StropError


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from strop.tokenizer_utils import get_tokenizer
    return get_tokenizer(str(tiny_model_dir))


def test_chatml_prompt_text(tokenizer):
    r = renderers.get_renderer("chatml", tokenizer)
    mi = r.build_generation_prompt([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert tokenizer.decode(mi.to_ints()) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_chatml_stop_and_parse(tokenizer):
    r = renderers.get_renderer("chatml", tokenizer)
    [stop] = r.get_stop_sequences()
    assert tokenizer.convert_ids_to_tokens(stop) == "<|im_end|>"
    body = tokenizer.encode("The answer is 5.")
    msg, ok = r.parse_response(body + [stop])
    assert ok and msg == {"role": "assistant", "content": "The answer is 5."}
    msg, ok = r.parse_response(body)
    assert not ok and renderers.get_text_content(msg) == "The answer is 5."


def test_qwen3_thinking_is_split_off(tokenizer):
    r = renderers.get_renderer("qwen3", tokenizer)
    msg, ok = r.parse_response(tokenizer.encode("<think>add them</think>\n\nIt is 5.") + r.get_stop_sequences())
    assert ok and msg["content"] == "It is 5." and msg["thinking"] == "add them"
    nothink = renderers.get_renderer("qwen3_disable_thinking", tokenizer)
    text = tokenizer.decode(nothink.build_generation_prompt([{"role": "user", "content": "Hi"}]).to_ints())
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_role_colon_stops_on_a_string(tokenizer):
    r = renderers.get_renderer("role_colon", tokenizer)
    assert r.get_stop_sequences() == ["\n\nUser:"]
    msg, ok = r.parse_response(tokenizer.encode(" It is 5.\n\nUser: and 6?"))
    assert ok and msg["content"] == "It is 5."


def test_chat_template_renderer_matches_the_tokenizer(tokenizer):
    r = renderers.get_renderer("chat_template", tokenizer)
    messages = [{"role": "user", "content": "Hi"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(r.build_generation_prompt(messages).to_ints()) == expected


def test_supervised_example_weights_only_the_last_turn(tokenizer):
    r = renderers.get_renderer("chatml", tokenizer)
    mi, weights = r.build_supervised_example([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    trained = [t for t, w in zip(mi.to_ints(), weights) if w]
    assert tokenizer.decode(trained) == "Hello<|im_end|>\n"
    assert len(weights) == mi.length


def test_text_content_of_parts():
    assert renderers.get_text_content({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"},
                                                                   {"type": "text", "text": "b"}]}) == "ab"


def test_recommended_renderers_and_unknown_name(tokenizer):
    assert model_info.get_recommended_renderer_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "chatml"
    assert model_info.get_recommended_renderer_name("Qwen/Qwen3-0.6B") == "qwen3"
    assert model_info.get_recommended_renderer_name("strop/tiny-random") == "chatml"
    with pytest.raises(StropError, match="unknown renderer 'llama9'.*chatml"):
        renderers.get_renderer("llama9", tokenizer)


def test_qwen3_disable_thinking_trains_the_reply_after_its_empty_think_block(tokenizer):
    # its generation header pre-fills a think block the rendered turn does not hold: the trained part was cut by
    # the header's length (training 'm_end|>\n') and an SFT turn repeated its header after the think block
    from strop.sft.data import render_conversation
    r = renderers.get_renderer("qwen3_disable_thinking", tokenizer)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "It is 5."}]
    mi, weights = r.build_supervised_example(messages)
    tokens, sft_weights = render_conversation(r, messages)
    for ids, w in ((mi.to_ints(), weights), (tokens, sft_weights)):
        assert tokenizer.decode([t for t, x in zip(ids, w) if x]) == "It is 5.<|im_end|>\n"
        assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nIt is 5.<|im_end|>\n")
