"""Supervised fine-tuning: only the assistant's tokens are trained, bad files are refused by line, and a few
steps on the tiny model lower the held-out loss."""

import json

import pytest
import torch

import strop
from strop import model_info
from strop.envs.finance_demos import demonstrations
from strop.envs.finance_sql import FinanceSQLEnv
from strop.errors import DatasetError
from strop.renderers import get_renderer
from strop.sft import SFTConfig, run_sft
from strop.sft.data import check_file, load_examples, render_conversation
from strop.sft.loop import example_datum
from strop.tokenizer_utils import get_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "5"},
        {"role": "assistant", "content": "The sum is 5."}]


def _renderer(model):
    return get_renderer(model_info.get_recommended_renderer_name(str(model)), get_tokenizer(str(model)))


def test_only_the_assistant_turns_carry_weight(tiny_model_dir):
    renderer = _renderer(tiny_model_dir)
    tokens, weights = render_conversation(renderer, CHAT, TOOLS)
    trained = renderer.tokenizer.decode([t for t, w in zip(tokens, weights) if w])
    assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in trained
    assert "The sum is 5." in trained and trained.count("<|im_end|>") == 2   # each turn learns to end
    untrained = renderer.tokenizer.decode([t for t, w in zip(tokens, weights) if not w])
    assert "What is 2 + 3?" in untrained and "<tool_response>\n5\n</tool_response>" in untrained
    assert "Be brief." in untrained and '"name": "add"' in untrained and "The sum" not in untrained
    # the conversation up to the second reply is exactly what a rollout's prompt renders
    prompt = renderer.build_tool_prompt(
        [CHAT[0], CHAT[1], {"role": "assistant", "content": trained.split("<|im_end|>")[0]}, CHAT[3]], TOOLS)
    assert tokens[:prompt.length] == prompt.to_ints()


def test_the_other_tokens_get_no_gradient(tiny_model_dir, tmp_path):
    renderer = _renderer(tiny_model_dir)
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"messages": CHAT, "tools": TOOLS}) + "\n")
    [example] = load_examples(path, renderer, max_seq_length=4096)
    training = strop.ServiceClient().create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=0)
    params = [p for p in training.trainer.model.parameters() if p.requires_grad]

    def gradients(datum):
        training.trainer.model.zero_grad(set_to_none=True)
        training.forward_backward([datum], loss_fn="cross_entropy").result()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    datum = example_datum(example)
    targets = datum.loss_fn_inputs["target_tokens"].to_torch().clone()
    weights = datum.loss_fn_inputs["weights"].to_torch()
    changed = targets.clone()
    changed[weights == 0] = (changed[weights == 0] + 7) % 100     # other targets where nothing is trained
    other = strop.types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": strop.types.TensorData.from_torch(changed), "weights": datum.loss_fn_inputs["weights"]})
    first, second = gradients(datum), gradients(other)
    assert any(g.abs().sum() > 0 for g in first)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    masked = strop.types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": datum.loss_fn_inputs["target_tokens"],
        "weights": strop.types.TensorData.from_torch(torch.zeros_like(weights))})
    assert all(g.abs().sum() == 0 for g in gradients(masked))


@pytest.mark.parametrize("line, expected", [
    ({"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]}, "unknown role 'wizard'"),
    ({"messages": CHAT, "tools": []}, "a call to 'add', which the line's tools do not declare"),
    ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
    ({"prompt": "x" * 5000, "completion": "y"}, "over maxSeqLength 256"),
    ({"prompt": 3}, "either messages"),
])
def test_a_bad_line_is_named_and_nothing_is_written(tiny_model_dir, tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine", "completion": "ok"}) + "\n" + json.dumps(line) + "\n")
    config = SFTConfig(base_model=str(tiny_model_dir), dataset=str(path), max_seq_length=256, max_steps=1)
    with pytest.raises(DatasetError, match="line 2") as caught:
        run_sft(config, tmp_path / "run", progress=False)
    assert expected in str(caught.value) and not (tmp_path / "run").exists()


_USER = {"role": "user", "content": "x"}


@pytest.mark.parametrize("line, expected", [
    ({"messages": [_USER, {"role": "assistant", "content": "y", "tool_calls": 5}]}, "tool_calls must be a list"),
    ({"messages": [_USER, {"role": "assistant", "content": "y", "tool_calls": {"a": 1}}]}, "tool_calls must be a list"),
    ({"messages": [_USER, {"role": "assistant", "tool_calls": ["add"]}], "tools": TOOLS}, "a tool call must look like"),
    ({"messages": [_USER, {"role": "assistant", "tool_calls": [{"function": "add"}]}], "tools": TOOLS},
     "a tool call must look like"),
    ({"messages": [_USER, {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "{a: 1"}}]}],
      "tools": TOOLS}, "arguments of the call to 'add' are not valid JSON"),
    ({"messages": [_USER, {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": [1]}}]}],
      "tools": TOOLS}, "must be an object or JSON text of one"),
    ({"messages": [_USER, {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "[1]"}}]}],
      "tools": TOOLS}, "must be a JSON object"),
    ({"messages": [_USER, {"role": "assistant", "content": "y"}], "tools": [{"function": "add"}]},
     "tools must be a list of OpenAI function schemas"),
    ({"messages": [_USER, {"role": "assistant", "content": "y"}], "tools": [{"name": ["add"]}]},
     "tools must be a list of OpenAI function schemas"),
    ({"messages": [_USER, {"role": "assistant", "content": "y"}], "tools": "add"}, "tools must be a list"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                   {"role": "assistant", "content": "y"}]}, "is a 'image_url' part; these models read text only"),
    ({"messages": [{"role": "user", "content": [7]}, {"role": "assistant", "content": "y"}]},
     "content[0] must be a part"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}, {"role": "assistant", "content": "y"}]},
     "content must be a string or a list of text parts"),
    ({"messages": [_USER, {"role": "assistant", "content": "y", "weight": 0.5}]}, "weight is 0 or 1"),
    ({"messages": [{"role": "user", "content": "x", "weight": 1}, {"role": "assistant", "content": "y"}]},
     "only on an assistant turn"),
    ({"messages": [{"role": "developer", "content": "x"}, {"role": "assistant", "content": "y"}]},
     "developer turn is a system turn here"),
    ({"prompt": [_USER], "completion": [{"role": "user", "content": "y"}]}, "the completion has no assistant turn"),
    ({"prompt": [_USER], "completion": []}, "two non-empty lists of messages"),
    ({"prompt": [{"role": 3}], "completion": [{"role": "assistant", "content": "y"}]}, "prompt[0]: unknown role"),
])
def test_a_malformed_transcript_is_one_clear_error_not_a_crash(tmp_path, line, expected):
    """Structures a stranger's file may hold (OpenAI's format has many optional shapes): each is refused by line and
    field with DatasetError; before, several raised TypeError or AttributeError from inside the check."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "fine", "completion": "ok"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(DatasetError, match="line 2") as caught:
        check_file(path)
    assert expected in str(caught.value)


def test_openai_and_trl_forms_train_what_they_say(tiny_model_dir, tmp_path):
    """Arguments given as an object are rendered as JSON (they were rendered as a Python dict's repr), text parts
    are read as text, weight 0 leaves an assistant turn untrained, and TRL's conversational prompt/completion
    trains only the completion."""
    renderer = _renderer(tiny_model_dir)
    as_object = [dict(m) for m in CHAT]
    as_object[2] = {"role": "assistant", "content": [{"type": "text", "text": "Calling."}], "tool_calls": [
        {"function": {"name": "add", "arguments": {"a": 2, "b": True, "c": "it's"}}}]}
    lines = [{"messages": as_object, "tools": TOOLS},
             {"messages": [_USER, {"role": "assistant", "content": "skip me", "weight": 0}, _USER,
                           {"role": "assistant", "content": "learn me"}]},
             {"prompt": [{"role": "system", "content": "Be brief."}, _USER,
                         {"role": "assistant", "content": "an earlier reply"}, _USER],
              "completion": [{"role": "assistant", "content": "the reply"}]}]
    path = tmp_path / "forms.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert check_file(path) == 3
    first, second, third = load_examples(path, renderer, max_seq_length=4096)

    def split(example):
        text = renderer.tokenizer.decode
        return (text([t for t, w in zip(example.tokens, example.weights) if w]),
                text([t for t, w in zip(example.tokens, example.weights) if not w]))

    trained, _ = split(first)
    assert 'Calling.\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": true, "c": "it\'s"}}</tool_call>' in trained
    trained, untrained = split(second)
    assert "learn me" in trained and "skip me" not in trained and "skip me" in untrained
    trained, untrained = split(third)
    assert "the reply" in trained and "an earlier reply" not in trained and "an earlier reply" in untrained


def test_a_bad_file_is_refused_before_any_model_is_loaded(tmp_path):
    """The file is checked first: a model that is not there (or a first use of SmolLM2, converted in most of a
    minute) is not reached, and the error is the file's."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "wizard", "content": "x"}]}) + "\n")
    config = SFTConfig(base_model=str(tmp_path / "no-such-model"), dataset=str(path), max_steps=1)
    with pytest.raises(DatasetError, match="line 1.*unknown role 'wizard'"):
        run_sft(config, tmp_path / "run", progress=False)


def test_all_empty_assistant_turns_are_refused(tiny_model_dir, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]})
                    + "\n")
    renderer = _renderer(tiny_model_dir)
    with pytest.raises(DatasetError, match="every assistant turn is empty"):
        load_examples(path, renderer, max_seq_length=256)
    with open(path, "a") as f:   # one real reply among empty ones is data
        f.write(json.dumps({"prompt": "x", "completion": "y"}) + "\n")
    assert len(load_examples(path, renderer, max_seq_length=256)) == 2


def test_sft_on_demonstrations_lowers_the_held_out_loss_and_resumes(tiny_model_dir, tmp_path):
    env = FinanceSQLEnv(seed=0)
    try:
        demos = list(demonstrations(env, n=24, mistakes=0.25, seed=0))
    finally:
        env.close()
    data = tmp_path / "demos.jsonl"
    data.write_text("".join(json.dumps({"messages": d["messages"], "tools": d["tools"]}) + "\n" for d in demos))
    config = SFTConfig(base_model=str(tiny_model_dir), dataset=str(data), eval_fraction=0.25, batch_size=4,
                       max_steps=12, learning_rate=1e-2, lora_rank=16, max_seq_length=8192, save_every=6, seed=0)
    result = run_sft(config, tmp_path / "run", progress=False)
    evals = [m["evalLoss"] for m in result.metrics if "evalLoss" in m]
    assert len(evals) == 2 and evals[1] < evals[0] - 0.3, evals   # measured: 6.91 -> 6.32 nats per token
    assert [m["step"] for m in result.metrics if m["step"] >= 0] == list(range(12))
    assert (result.final_adapter / "adapter_config.json").exists()
    assert (tmp_path / "run" / "checkpoints" / "step-000012").is_dir()
    again = run_sft(SFTConfig(**{**config.to_dict(), "max_steps": 14}), tmp_path / "run", progress=False)
    assert [m["step"] for m in again.metrics if m["step"] >= 0] == list(range(14))   # resumed at step 12


def test_strop_train_method_sft(tiny_model_dir, tmp_path, capsys):
    from strop.cli.main import main
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "completion": f"{i + 1}"}) + "\n"
                            for i in range(12)))
    code = main(["train", "--method", "sft", "--base-model", str(tiny_model_dir), "--dataset", str(data), "--steps",
                 "2", "--batch-size", "4", "--run-dir", str(tmp_path / "run"), "--quiet", "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["steps"] == 2 and summary["heldOutLossAfter"] is not None
    assert json.loads((tmp_path / "run" / "config.json").read_text())["method"] == "sft"
    assert main(["train", "--method", "sft", "--dataset", str(data), "--reward", "builtin:gsm8k"]) == 1
    assert "--reward: a GRPO setting, which --method sft does not take" in capsys.readouterr().err


def test_grpo_continues_from_the_supervised_adapter(tiny_model_dir, tmp_path, capsys):
    from safetensors.torch import load_file

    from strop.cli.main import main
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 2?", "completion": f"{i + 2}"}) + "\n"
                            for i in range(12)))
    assert main(["train", "--method", "sft", "--base-model", str(tiny_model_dir), "--dataset", str(data), "--steps",
                 "2", "--batch-size", "4", "--rank", "8", "--lr", "0.01", "--run-dir", str(tmp_path / "sft"),
                 "--quiet"]) == 0
    adapter = tmp_path / "sft" / "final"
    training = strop.ServiceClient().create_training_client_from_adapter(str(tiny_model_dir), adapter, seed=5)
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    state = training.trainer.lora_state_dict()
    assert training.trainer.config.r == 8 and len(state) == len(saved)
    assert all(torch.equal(state[k], saved[k]) for k in saved)       # the SFT weights, not a fresh init
    code = main(["train", "--base-model", str(tiny_model_dir), "--init-adapter", str(adapter), "--steps", "1",
                 "--group-size", "2", "--batch-size", "2", "--max-tokens", "4", "--run-dir", str(tmp_path / "rl"),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "rl" / "config.json").read_text())["init_adapter"] == str(adapter.resolve())
    capsys.readouterr()
    assert main(["train", "--base-model", str(tiny_model_dir), "--init-adapter", str(tmp_path), "--steps", "1"]) == 1
    assert "--init-adapter (init_adapter)" in capsys.readouterr().err and not (tmp_path / "rl2").exists()


def test_supervised_memory_is_planned_before_anything_is_written(tiny_model_dir, tmp_path, monkeypatch):
    from strop.engine.resources import MemoryRefused
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": "q" * 200, "completion": "a"}) + "\n" for _ in range(4)))
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "1")
    with pytest.raises(MemoryRefused, match="supervised fine-tuning of"):
        run_sft(SFTConfig(base_model=str(tiny_model_dir), dataset=str(data), max_steps=1), tmp_path / "run",
                progress=False)
    assert not (tmp_path / "run").exists()


def test_an_oversized_line_is_refused_without_being_tokenized(tiny_model_dir, tmp_path):
    import time
    renderer = _renderer(tiny_model_dir)
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "a b " * 2_000_000, "completion": "y"}) + "\n")   # 8 MB of short tokens
    started = time.monotonic()
    with pytest.raises(DatasetError, match="more than maxSeqLength 2,048 tokens can hold"):
        load_examples(path, renderer, max_seq_length=2048)
    assert time.monotonic() - started < 5    # tokenizing 8 MB would take far longer on this machine


def test_a_line_past_the_limit_is_refused_without_being_held_in_memory(tmp_path):
    import tracemalloc
    from strop.sft.data import MAX_LINE_BYTES
    path = tmp_path / "one-line.jsonl"
    good = json.dumps({"prompt": "p", "completion": "c"}) + "\n"
    with path.open("w") as f:  # a good line, then 6x the limit with no newline at all, as a hostile file has
        f.write(good)
        for _ in range(6 * MAX_LINE_BYTES // (1 << 20)):
            f.write("x" * (1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError, match=f"line 2: {6 * MAX_LINE_BYTES:,} bytes, over the {MAX_LINE_BYTES:,}"):
            check_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_LINE_BYTES, peak  # the line is 6x the limit: it was never read whole
    path.write_text("x" * (MAX_LINE_BYTES + 10) + "\n" + good)  # an over-long line with its end: the next is read
    with pytest.raises(DatasetError, match="has 1 problem:\n  line 1: "):
        check_file(path)
