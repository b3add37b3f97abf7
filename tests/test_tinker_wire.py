"""`strop serve-tinker` driven by the unmodified `tinker` SDK (PyPI, 0.38) on loopback, on the tiny model.

The SDK is configured only as its users configure it: TINKER_BASE_URL and TINKER_API_KEY. Raw HTTP (httpx) is used
only where a test sends what the SDK never would (garbage protobuf, another key's future ids, oversized bodies).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the dev install brings the tinker SDK: pip install -e '.[dev]'")
from tinker import types  # noqa: E402

from strop.tinker_wire.app import TinkerServer, make_tinker_app  # noqa: E402
from strop.tinker_wire.service import TinkerService  # noqa: E402

MODEL = "strop/tiny-random"


# the keys the test servers accept (a server takes only its keys unless it is started open)
KEYS = {"tml-alice", "tml-bob", "tml-carol", "tml-slow", "tml-restart", "tml-many", "tml-someone-else"}


def start(root: Path, api_keys=KEYS, long_poll_s: float = 20.0, **service_options) -> TinkerServer:
    from strop.control.tinker_checkpoints import register_checkpoint     # what `strop serve-tinker` hands it
    service = TinkerService(root, register_checkpoint=register_checkpoint, **service_options)
    app = make_tinker_app(service, api_keys=api_keys, open_mode=api_keys is None, long_poll_s=long_poll_s)
    return TinkerServer(app, port=0).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("tinker"))
    yield srv
    srv.stop()


@pytest.fixture
def sdk_env(server, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", "tml-alice")
    return server


def raw_post(url: str, path: str, declared_length: int) -> bytes:
    """What the server answers a POST whose head declares `declared_length` body bytes (and sends none)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-alice\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {declared_length}\r\n\r\n".encode())
        return sock.recv(4096)


def sft_datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


def test_seed_000s_loop_runs_through_the_unmodified_sdk(sdk_env):
    """Seed 000's RL loop (sample groups, reward, centre, importance_sampling, optim_step, a fresh sampling client
    each step) with `import tinker` and nothing else: sampling is batched server-side, the sampler's logprobs are
    the trainer's for the same tokens, and training moves the policy towards rewarded tokens."""
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=8).result()
    tokenizer = training_client.get_tokenizer()         # tokenizer_id points at the model folder: no hub
    prompt = types.ModelInput.from_ints(tokenizer.encode("2 + 3 ="))
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    adam = types.AdamParams(learning_rate=5e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    target = 42                                           # the "right answer": the first token being 42

    first_token_share = []
    for step in range(4):
        sampling_client = training_client.save_weights_and_get_sampling_client().result()
        futures = [sampling_client.sample(prompt=prompt, num_samples=8, sampling_params=params) for _ in range(2)]
        datums = []
        for future in futures:
            result = future.result()
            assert len(result.sequences) == 8 and all(len(s.tokens) == len(s.logprobs) for s in result.sequences)
            rewards = [1.0 if s.tokens[0] == target else 0.0 for s in result.sequences]
            mean = sum(rewards) / len(rewards)
            ob_len = prompt.length - 1
            for seq, reward in zip(result.sequences, rewards):
                toks, lps = list(seq.tokens), list(seq.logprobs)
                mi = prompt.append(types.EncodedTextChunk(tokens=toks[:-1]))
                # reward the first answer token towards `target` (a dense stand-in for a grader on a random model)
                adv = [0.0] * ob_len + [1.0 if t == target else -0.05 for t in toks[:1]] + [0.0] * (len(toks) - 1)
                datums.append(types.Datum(model_input=mi, loss_fn_inputs={
                    "target_tokens": [0] * ob_len + toks, "logprobs": [0.0] * ob_len + lps,
                    "advantages": adv if mean in (0.0, 1.0) else [a + (reward - mean) * (a != 0) for a in adv]}))
        if step == 0:   # the sampler's logprobs are the trainer's, token for token, for the same weights
            out = training_client.forward(datums[:4], loss_fn="importance_sampling").result()
            for datum, o in zip(datums[:4], out.loss_fn_outputs):
                sampled = np.array(datum.loss_fn_inputs["logprobs"].data)[ob_len:]
                trained = np.array(o["logprobs"].data)[ob_len:]
                assert np.abs(sampled - trained).max() < 2e-3
        # the forced-target datum keeps the signal dense on this random model
        forced = prompt.append(types.EncodedTextChunk(tokens=[]))
        datums.append(types.Datum(model_input=forced, loss_fn_inputs={
            "target_tokens": [0] * ob_len + [target], "logprobs": [0.0] * ob_len + [-7.0],
            "advantages": [0.0] * ob_len + [1.0]}))
        fb = training_client.forward_backward(datums, loss_fn="importance_sampling")
        opt = training_client.optim_step(adam)
        assert np.isfinite(fb.result().metrics["loss:sum"])
        assert "grad_norm" in opt.result().metrics
        lp = training_client.forward([sft_datum(prompt.to_ints() + [target])], "cross_entropy").result()
        first_token_share.append(float(lp.loss_fn_outputs[0]["logprobs"].data[-1]))
    assert first_token_share[-1] > first_token_share[0] + 0.5, first_token_share
    service_client.close("success").result()


@pytest.mark.parametrize("loss_fn,config", [("cross_entropy", None), ("importance_sampling", None),
                                            ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
                                            ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}),
                                            ("dro", {"beta": 0.1})])
def test_every_loss_the_sdk_names_trains(sdk_env, loss_fn, config):
    service_client = tinker.ServiceClient()
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
    tokens = [5, 17, 29, 33, 41, 8, 12]
    n = len(tokens) - 1
    inputs = {"target_tokens": tokens[1:]}
    if loss_fn == "cross_entropy":
        inputs["weights"] = [0.0, 0.0] + [1.0] * (n - 2)
    else:
        inputs["logprobs"] = [0.0, 0.0] + [-6.5] * (n - 2)
        inputs["advantages"] = [0.0, 0.0] + [1.0] * (n - 2)
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
    before = client.forward([datum], loss_fn, config).result()
    for _ in range(3):
        client.forward_backward([datum], loss_fn, config).result()
        client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    after = client.forward([datum], loss_fn, config).result()
    assert len(after.loss_fn_outputs[0]["logprobs"].data) == n
    gained = np.array(after.loss_fn_outputs[0]["logprobs"].data[2:]) - np.array(before.loss_fn_outputs[0]["logprobs"].data[2:])
    assert gained.mean() > 0.05, (loss_fn, gained)    # every one of these raises p(target) for a positive signal
    if loss_fn == "cross_entropy":    # the policy losses' values carry the importance ratio, which grows too
        assert after.metrics["loss:sum"] < before.metrics["loss:sum"]
    service_client.close("success").result()


def test_forward_backward_custom_and_unsupported_losses(sdk_env):
    service_client = tinker.ServiceClient()
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4).result()
    datum = sft_datum([3, 9, 27, 81, 243])

    def neg_mean_logprob(data, logprobs_list):
        loss = -sum(lp.sum() for lp in logprobs_list) / sum(len(lp) for lp in logprobs_list)
        return loss, {"custom:mean": float(loss.detach())}
    result = client.forward_backward_custom([datum], neg_mean_logprob).result()
    assert result.metrics["custom:mean"] > 0
    with pytest.raises(tinker.BadRequestError, match="gspo.*not supported"):
        client.forward_backward([datum], "gspo").result()
    with pytest.raises(tinker.BadRequestError, match="unsupported key 'kl_coeff'"):
        client.forward_backward([datum], "ppo", {"kl_coeff": 0.1}).result()
    service_client.close("success").result()


def test_sampling_honours_seeds_stops_and_returns_prompt_logprobs(sdk_env):
    service_client = tinker.ServiceClient()
    sampler = service_client.create_sampling_client(base_model=MODEL).result()
    prompt = types.ModelInput.from_ints([1, 2, 3, 4])
    params = types.SamplingParams(max_tokens=8, seed=123, temperature=1.0)
    a = sampler.sample(prompt, 3, params).result()
    b = sampler.sample(prompt, 3, params).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert all(s.stop_reason == "length" and len(s.tokens) == 8 for s in a.sequences)
    stop_at = a.sequences[0].tokens[2]
    c = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=123, stop=[stop_at])).result()
    assert c.sequences[0].stop_reason == "stop" and c.sequences[0].tokens[-1] == stop_at
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints([1, 2, 3, 4, 5])).result()
    assert logprobs[0] is None and all(v < 0 for v in logprobs[1:])
    with_prompt = sampler.sample(prompt, 1, params, include_prompt_logprobs=True).result()
    assert with_prompt.prompt_logprobs[1:] == pytest.approx(logprobs[1:4], abs=1e-4)
    service_client.close("success").result()


def test_top_k_logprobs_of_the_prompt_and_of_the_samples(sdk_env):
    """topk_prompt_logprobs and topk_sample_logprobs (what tinker-cookbook's distillation asks a teacher for):
    under greedy decoding each sampled token is its position's top-1, with the sampled logprob; a prompt that
    continues greedily has its own tokens at top-1 there; each row is sorted and a distribution's head."""
    service_client = tinker.ServiceClient()
    sampler = service_client.create_sampling_client(base_model=MODEL).result()
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    out = sampler.sample(types.ModelInput.from_ints([1, 2, 3, 4]), 2, greedy, topk_sample_logprobs=3).result()
    for seq in out.sequences:
        assert len(seq.topk_logprobs) == len(seq.tokens) == 6
        for token, logprob, row in zip(seq.tokens, seq.logprobs, seq.topk_logprobs):
            assert len(row) == 3 and row[0][0] == token and row[0][1] == pytest.approx(logprob, abs=1e-4)
            assert [lp for _, lp in row] == sorted((lp for _, lp in row), reverse=True)
    text = [1, 2, 3, 4] + list(out.sequences[0].tokens)
    scored = sampler.sample(types.ModelInput.from_ints(text), 1, types.SamplingParams(max_tokens=1),
                            include_prompt_logprobs=True, topk_prompt_logprobs=5).result()
    rows = scored.topk_prompt_logprobs
    assert rows[0] is None and len(rows) == len(text) and all(len(r) == 5 for r in rows[1:])
    assert [r[0][0] for r in rows[4:]] == text[4:]                     # the greedy continuation is each top-1
    for row, token, logprob in zip(rows[1:], text[1:], scored.prompt_logprobs[1:]):
        assert sum(np.exp(lp) for _, lp in row) <= 1 + 1e-5
        assert dict(row).get(token, logprob) == pytest.approx(logprob, abs=1e-4)   # where the token is in the top 5
    last = sampler.sample(types.ModelInput.from_ints(text), 1, types.SamplingParams(max_tokens=1),
                          include_prompt_logprobs=True, topk_prompt_logprobs=2, prompt_logprobs_last_n=3).result()
    assert last.topk_prompt_logprobs[:-3] == [None] * (len(text) - 3)
    for mine, full in zip(last.topk_prompt_logprobs[-3:], rows[-3:]):
        assert mine[0][0] == full[0][0] and mine[0][1] == pytest.approx(full[0][1], abs=1e-4)
    with pytest.raises(tinker.BadRequestError, match="topk_prompt_logprobs must be 0..128"):
        sampler.sample(types.ModelInput.from_ints(text), 1, greedy, topk_prompt_logprobs=1000).result()
    service_client.close("success").result()


def test_results_slower_than_the_long_poll_arrive_after_try_again(tmp_path, monkeypatch):
    srv = start(tmp_path / "slow", long_poll_s=0.05)
    try:
        monkeypatch.setenv("TINKER_BASE_URL", srv.url)
        sc = tinker.ServiceClient(api_key="tml-slow")
        sampler = sc.create_sampling_client(base_model=MODEL).result()
        t0 = time.monotonic()
        out = sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 32,
                             types.SamplingParams(max_tokens=160, seed=3)).result()
        assert time.monotonic() - t0 > 0.05 * 3          # several polls were answered "not yet"
        assert len(out.sequences) == 32 and all(1 <= len(s.tokens) <= 160 for s in out.sequences)
        sc.close("success").result()
    finally:
        srv.stop()


def test_checkpoints_are_files_that_survive_a_restart(tmp_path, monkeypatch):
    root = tmp_path / "tinker"
    first = start(root)
    monkeypatch.setenv("TINKER_BASE_URL", first.url)
    monkeypatch.setenv("TINKER_API_KEY", "tml-restart")
    service_client = tinker.ServiceClient()
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4).result()
    datum = sft_datum([7, 14, 21, 28, 35])
    for _ in range(2):
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state_path = client.save_state("after-two").result().path
    sampler_path = client.save_weights_for_sampler("for-sampling").result().path
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    before = client.create_sampling_client(sampler_path).result().sample(types.ModelInput.from_ints([7, 14]), 1, greedy).result()
    next_loss = client.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
    run_id = client.model_id
    service_client.close("success").result()
    first.stop()

    second = start(root)                      # a new server process would read the same folders
    monkeypatch.setenv("TINKER_BASE_URL", second.url)
    try:
        rest = tinker.RestClient(base_url=second.url, api_key="tml-restart")
        runs = rest.list_training_runs().result().training_runs
        assert run_id in [r.training_run_id for r in runs]
        ids = {c.checkpoint_id for c in rest.list_checkpoints(run_id).result().checkpoints}
        assert ids == {"weights/after-two", "sampler_weights/for-sampling"}
        assert (root / "runs" / run_id / "weights" / "after-two" / "adapter_model.safetensors").is_file()
        # each checkpoint is a tuned model in strop's store, servable like a run's
        from strop.control import models
        from strop.control.evaluations import resolve_model
        from strop.serve import make_server
        folder = root / "runs" / run_id / "sampler_weights" / "for-sampling"
        [registered] = [m for m in models.list_all() if m["adapterPath"] == str(folder)]
        served = resolve_model(registered["modelId"])
        assert served["baseModel"] == MODEL and served["adapter"] == str(folder)
        openai_server = make_server(MODEL, base_path=served["basePath"], adapter=served["adapter"], port=0)
        openai_server.server_close()
        service_client = tinker.ServiceClient()
        again = service_client.create_sampling_client(model_path=sampler_path).result()
        after = again.sample(types.ModelInput.from_ints([7, 14]), 1, greedy).result()
        assert after.sequences[0].tokens == before.sequences[0].tokens
        resumed = service_client.create_training_client_from_state_with_optimizer(state_path).result()
        assert resumed.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"] == \
            pytest.approx(next_loss, rel=1e-4)
        service_client.close("success").result()
    finally:
        second.stop()


def test_two_sessions_train_at_once_and_cannot_touch_each_others_work(server, monkeypatch):
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    results, errors = {}, []

    def train(key: str, tokens: list[int]):
        try:
            sc = tinker.ServiceClient(api_key=key)
            tc = sc.create_lora_training_client(base_model=MODEL, rank=4).result()
            losses = []
            for _ in range(4):
                losses.append(tc.forward_backward([sft_datum(tokens)], "cross_entropy").result().metrics["loss:sum"])
                tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
            results[key] = (tc.model_id, tc.save_state("mine").result().path, losses)
            sc.close("success").result()
        except Exception as exc:  # reported below, with the thread's key
            errors.append((key, exc))
    threads = [threading.Thread(target=train, args=("tml-bob", [2, 4, 6, 8, 10, 12])),
               threading.Thread(target=train, args=("tml-carol", [9, 7, 5, 3, 1]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for key in ("tml-bob", "tml-carol"):
        assert results[key][2][-1] < results[key][2][0]     # each trained its own adapter
    bob_run, bob_path, _ = results["tml-bob"]
    carol = tinker.ServiceClient(api_key="tml-carol")
    with pytest.raises(Exception, match="no (training run|checkpoint)"):
        carol.create_training_client_from_state(bob_path).result()
    assert bob_run not in [r.training_run_id for r in tinker.RestClient(base_url=server.url, api_key="tml-carol")
                           .list_training_runs()
                           .result().training_runs]
    # another key's future ids are not found, not served
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = http.post("/api/v1/create_session", headers={"X-API-Key": "tml-bob"},
                        json={"tags": [], "user_metadata": None, "sdk_version": "x"}).json()["session_id"]
        made = http.post("/api/v1/create_model", headers={"X-API-Key": "tml-bob"},
                         json={"session_id": sid, "model_seq_id": 0, "base_model": MODEL,
                               "lora_config": {"rank": 2}}).json()
        stolen = http.post("/api/v1/retrieve_future", headers={"X-API-Key": "tml-carol"},
                           json={"request_id": made["request_id"]})
        assert stolen.status_code == 404
        mine = http.post("/api/v1/retrieve_future", headers={"X-API-Key": "tml-bob"},
                         json={"request_id": made["request_id"]})
        assert mine.status_code == 200 and mine.json()["model_id"] == made["model_id"]
    carol.close("success").result()


def test_bad_requests_get_the_sdks_errors_and_harm_no_other_session(sdk_env):
    url = sdk_env.url
    service_client = tinker.ServiceClient()
    with pytest.raises(tinker.BadRequestError, match="unknown base model 'no/such-model'"):
        service_client.create_lora_training_client(base_model="no/such-model", rank=4).result()
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="outside the model's vocabulary"):
        client.forward_backward([sft_datum([1, 2, 10**6])], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="not a tinker:// checkpoint path|not a checkpoint path"):
        service_client.create_training_client_from_state("tinker://../../etc/weights/passwd").result()
    with httpx.Client(base_url=url, timeout=30) as http:
        key = {"X-API-Key": "tml-alice"}
        garbage = http.post("/api/v1/forward_backward", content=b"\xff\x00\x12garbage" * 10,
                            headers={**key, "Content-Type": "application/x-protobuf"})
        assert garbage.status_code == 400 and "protobuf" in garbage.json()["detail"]
        assert raw_post(url, "/api/v1/create_session", 1 << 30).startswith(b"HTTP/1.1 413")   # refused unread
        missing = http.post("/api/v1/retrieve_future", headers=key, json={"request_id": "f" + "0" * 24})
        assert missing.status_code == 404 and "no request" in missing.json()["detail"]
        nokey = http.post("/api/v1/create_session", json={"tags": [], "user_metadata": None, "sdk_version": "x"})
        assert nokey.status_code == 401
        bad_json = http.post("/api/v1/optim_step", headers=key, json={"model_id": client.model_id,
                                                                       "adam_params": {"learning_rate": "fast"}})
        assert bad_json.status_code == 400 and "learning_rate" in bad_json.json()["detail"]
    sampler = service_client.create_sampling_client(base_model=MODEL).result()
    with pytest.raises(tinker.BadRequestError, match="per request"):
        sampler.sample(types.ModelInput.from_ints([1, 2]), 128, types.SamplingParams(max_tokens=2000)).result()
    with pytest.raises(tinker.BadRequestError, match="num_samples must be 1..128"):
        sampler.sample(types.ModelInput.from_ints([1, 2]), 129, types.SamplingParams(max_tokens=2)).result()
    # the session that sent all of that still trains
    loss = client.forward_backward([sft_datum([1, 2, 3, 4])], "cross_entropy").result().metrics["loss:sum"]
    assert np.isfinite(loss)
    service_client.close("success").result()


def test_a_wrong_key_is_refused_when_the_server_has_keys(tmp_path, monkeypatch):
    srv = start(tmp_path / "keyed", api_keys={"tml-right"})
    with pytest.raises(ValueError, match="api_keys .* or open_mode"):
        make_tinker_app(srv.app.state.service)      # neither keys nor open: no server
    try:
        monkeypatch.setenv("TINKER_BASE_URL", srv.url)
        with pytest.raises(tinker.AuthenticationError, match="wrong API key"):
            tinker.ServiceClient(api_key="tml-wrong").create_lora_training_client(base_model=MODEL, rank=2).result()
        ok = tinker.ServiceClient(api_key="tml-right")
        assert ok.create_lora_training_client(base_model=MODEL, rank=2).result().model_id
        ok.close("success").result()
    finally:
        srv.stop()


def test_the_command_serves_and_refuses_a_missing_key_variable(tmp_path):
    env = {**os.environ, "STROP_HOME": str(tmp_path)}
    env.pop("NO_SUCH_KEY_VAR", None)
    bad = subprocess.run([sys.executable, "-m", "strop.cli.main", "serve-tinker", "--api-key-env", "NO_SUCH_KEY_VAR"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "NO_SUCH_KEY_VAR" in bad.stderr and "Traceback" not in bad.stderr
    # serving other machines with no key at all needs the operator's word for it
    keyless = subprocess.run([sys.executable, "-m", "strop.cli.main", "serve-tinker", "--host", "0.0.0.0"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert keyless.returncode == 1 and "--api-key-env" in keyless.stderr and "--open" in keyless.stderr
    helped = subprocess.run([sys.executable, "-m", "strop.cli.main", "serve-tinker", "--help"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert "per client address" in helped.stdout and "does not start" in helped.stdout
    # the contract's plain form, on loopback: open, quotas per address
    proc = subprocess.Popen([sys.executable, "-m", "strop.cli.main", "serve-tinker", "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert "open mode" in proc.stderr.readline()
        line = proc.stderr.readline()
        url = line.split("tinker API at ")[1].split()[0]
        assert httpx.get(f"{url}/api/v1/healthz", timeout=10).json() == {"status": "ok"}
        # SIGTERM stops it promptly; answering queued jobs on SIGTERM is not asserted here: with the SDK's own
        # sending thread it was timing-dependent on a loaded 2-core machine (CI failed it once)
        t0 = time.monotonic()
        proc.terminate()
        proc.wait(timeout=15)
        assert time.monotonic() - t0 < 15
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_an_open_server_counts_quotas_per_client_address_not_per_made_up_key(tmp_path):
    from strop.tinker_wire.service import MAX_SESSIONS_PER_KEY
    srv = start(tmp_path / "open", api_keys=None)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            def session(key: str) -> httpx.Response:
                return http.post("/api/v1/create_session", headers={"X-API-Key": key},
                                 json={"tags": [], "user_metadata": None, "sdk_version": "x"})
            for i in range(MAX_SESSIONS_PER_KEY):
                assert session(f"tml-made-up-{i}").status_code == 200
            refused = session("tml-made-up-another")
            assert refused.status_code == 400 and "client address" in refused.json()["detail"]
    finally:
        srv.stop()


def test_names_ending_in_a_newline_and_deeply_nested_json_are_clear_400s(sdk_env):
    from strop.tinker_wire.checkpoints import check_name
    with pytest.raises(ValueError, match="not allowed"):
        check_name("evil\n")
    with httpx.Client(base_url=sdk_env.url, timeout=30) as http:
        key = {"X-API-Key": "tml-alice"}
        newline = http.post("/api/v1/weights_info", headers=key,
                            json={"tinker_path": "tinker://s0:train:0\n/weights/evil"})
        assert newline.status_code == 400 and "not a checkpoint path" in newline.json()["detail"]
        deep = http.post("/api/v1/create_session", headers={**key, "Content-Type": "application/json"},
                         content=b"[" * 100_000 + b"]" * 100_000)
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["detail"]
        deep_field = http.post("/api/v1/weights_info", headers={**key, "Content-Type": "application/json"},
                               content=b'{"tinker_path": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        assert deep_field.status_code == 400


def test_the_rest_client_lists_describes_and_deletes(sdk_env):
    service_client = tinker.ServiceClient(user_metadata={"purpose": "rest"})
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4).result()
    keep = client.save_weights_for_sampler("keep").result().path
    drop = client.save_state("drop").result().path
    # RestClient() with no arguments is cached per process by the SDK under those (empty) arguments, so a test
    # process that has talked to other servers names this one
    rest = tinker.RestClient(base_url=sdk_env.url, api_key="tml-alice")
    run = rest.get_training_run(client.model_id).result()
    assert run.base_model == MODEL and run.lora_rank == 4 and run.last_sampler_checkpoint.tinker_path == keep
    info = rest.get_weights_info_by_tinker_path(keep).result()
    assert info.base_model == MODEL and info.lora_rank == 4
    mine = {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints}
    assert {keep, drop} <= mine
    rest.delete_checkpoint_from_tinker_path(drop).result()
    left = {c.tinker_path for c in rest.list_checkpoints(client.model_id).result().checkpoints}
    assert left == {keep}
    session_id = service_client.holder.get_session_id()
    assert session_id in rest.list_sessions().result().sessions
    assert client.model_id in rest.get_session(session_id).result().training_run_ids
    with pytest.raises(tinker.NotFoundError):
        tinker.RestClient(base_url=sdk_env.url, api_key="tml-someone-else").get_training_run(client.model_id).result()
    offered = [m.model_name for m in rest.get_server_capabilities().result().supported_models]
    assert MODEL in offered
    service_client.close("success").result()


def test_inflight_sampling_clients_follow_the_newest_inflight_save_and_snapshots_do_not(sdk_env):
    """SamplingClientKind's contract: every inflight client of a training model samples its newest inflight save,
    older clients too; a snapshot (the default) keeps the weights it was made with."""
    service_client = tinker.ServiceClient()
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4).result()
    prompt, greedy = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=4, temperature=0.0)

    def tokens(sampler) -> list[int]:
        return list(sampler.sample(prompt, 1, greedy).result().sequences[0].tokens)

    snapshot = client.save_weights_and_get_sampling_client().result()
    first = client.save_weights_and_get_sampling_client(kind="inflight").result()
    before = tokens(first)
    assert tokens(snapshot) == before
    for _ in range(6):              # teach it to answer 99 99 99 99
        client.forward_backward([sft_datum([1, 2, 3, 99, 99, 99, 99])], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert tokens(first) == before                  # no inflight save yet: the weights it was given
    second = client.save_weights_and_get_sampling_client(kind="inflight").result()
    after = tokens(second)
    assert after == [99, 99, 99, 99] != before
    assert tokens(first) == after                   # the older inflight client moved with the save
    assert tokens(snapshot) == before               # the snapshot did not
    service_client.close("success").result()


def test_published_checkpoints_projects_and_ttls(sdk_env):
    """RestClient's publish/unpublish (another key may then sample and load the checkpoint, never change it),
    projects (a session's, or one assigned later, filter list_training_runs) and checkpoint TTLs (one past its
    TTL is gone)."""
    url = sdk_env.url
    alice = tinker.ServiceClient(project_id="proj-a", base_url=url, api_key="tml-alice")
    client = alice.create_lora_training_client(base_model=MODEL, rank=4).result()
    path = client.save_weights_for_sampler("shared").result().path
    rest = tinker.RestClient(base_url=url, api_key="tml-alice")
    bob = tinker.ServiceClient(base_url=url, api_key="tml-bob")
    bob_rest = tinker.RestClient(base_url=url, api_key="tml-bob")
    with pytest.raises(tinker.NotFoundError):
        bob.create_sampling_client(model_path=path).result()

    rest.publish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.BadRequestError, match="public already"):    # not a 409: the SDK retries those
        rest.publish_checkpoint_from_tinker_path(path).result()
    assert [c.public for c in rest.list_checkpoints(client.model_id).result().checkpoints] == [True]
    sampler = bob.create_sampling_client(model_path=path).result()
    assert len(sampler.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=3))
               .result().sequences[0].tokens) == 3
    owned = {r.training_run_id for r in bob_rest.list_training_runs().result().training_runs}
    seen = bob_rest.list_training_runs(access_scope="accessible").result().training_runs
    assert [(r.training_run_id, r.last_sampler_checkpoint.tinker_path) for r in seen
            if r.training_run_id not in owned] == [(client.model_id, path)]
    assert client.model_id not in owned
    for change in (lambda: bob_rest.delete_checkpoint_from_tinker_path(path).result(),
                   lambda: bob_rest.unpublish_checkpoint_from_tinker_path(path).result()):
        with pytest.raises(tinker.NotFoundError):
            change()
    rest.unpublish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.NotFoundError):
        bob.create_sampling_client(model_path=path).result()
    assert rest.get_weights_info_by_tinker_path(path).result().lora_rank == 4   # still there, still hers

    other = tinker.ServiceClient(base_url=url, api_key="tml-alice")              # in no project
    moved = other.create_lora_training_client(base_model=MODEL, rank=2).result()
    assert [r.training_run_id for r in rest.list_training_runs(project_id="proj-a").result().training_runs] \
        == [client.model_id]
    rest.assign_session_project(other.holder.get_session_id(), "proj-b").result()
    assert [r.training_run_id for r in rest.list_training_runs(project_id="proj-b").result().training_runs] \
        == [moved.model_id]

    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    expires = rest.list_checkpoints(client.model_id).result().checkpoints[0].expires_at
    assert 7100 < expires.timestamp() - time.time() <= 7200
    rest.set_checkpoint_ttl_from_tinker_path(path, 1).result()
    time.sleep(1.2)
    assert rest.list_checkpoints(client.model_id).result().checkpoints == []    # past its TTL: deleted
    with pytest.raises(tinker.NotFoundError):
        alice.create_sampling_client(model_path=path).result()
    for service_client in (alice, bob, other):
        service_client.close("success").result()


def test_a_request_that_fails_while_it_runs_reaches_result_as_request_failed(sdk_env):
    service_client = tinker.ServiceClient()
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4).result()
    no_weights = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                             loss_fn_inputs={"target_tokens": [2, 3, 4]})
    with pytest.raises(tinker.RequestFailedError, match="weights"):
        client.forward_backward([no_weights], "cross_entropy").result()
    service_client.close("success").result()


def test_idle_sessions_are_closed_and_their_models_freed(tmp_path, monkeypatch):
    from strop.tinker_wire import service as service_module
    service = TinkerService(tmp_path / "idle")
    try:
        session = service.create_session("owner", [], None)
        model = service.add_model(session, 0, MODEL, 4, {})
        service.reap(now=time.time() + service_module.SESSION_IDLE_S - 5)
        assert service.model(model.id, "owner") is model           # still within its idle time
        service.reap(now=time.time() + service_module.SESSION_IDLE_S + 5)
        assert session.finished == "expired" and model.id not in service.models
        with pytest.raises(Exception, match="no training model"):
            service.model(model.id, "owner")
    finally:
        service.close()


def test_a_session_keeps_its_newest_sampling_clients_and_a_key_its_share_of_models(sdk_env):
    from strop.tinker_wire.service import MAX_MODELS_PER_KEY, MAX_SAMPLERS_PER_SESSION
    service_client = tinker.ServiceClient(api_key="tml-many")
    client = service_client.create_lora_training_client(base_model=MODEL, rank=2).result()
    samplers = [client.save_weights_and_get_sampling_client().result() for _ in range(MAX_SAMPLERS_PER_SESSION + 1)]
    prompt, params = types.ModelInput.from_ints([1, 2]), types.SamplingParams(max_tokens=2, seed=0)
    assert len(samplers[-1].sample(prompt, 1, params).result().sequences) == 1
    with pytest.raises(Exception, match="was released"):
        samplers[0].sample(prompt, 1, params).result()
    for _ in range(MAX_MODELS_PER_KEY - 1):
        service_client.create_lora_training_client(base_model=MODEL, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match=f"trains {MAX_MODELS_PER_KEY} models already"):
        service_client.create_lora_training_client(base_model=MODEL, rank=2).result()
    service_client.close("success").result()
    again = tinker.ServiceClient(api_key="tml-many")     # a finished session frees its models
    assert again.create_lora_training_client(base_model=MODEL, rank=2).result().model_id
    again.close("success").result()


def test_a_loaded_checkpoint_gives_weights_never_the_publishers_store_run(sdk_env):
    """Bob continues from Alice's published state and saves: his checkpoint is a model of a store run of his own
    training run, and Alice's store run still serves her weights (it used to be re-pointed at Bob's)."""
    from sqlalchemy import select

    from strop.store import open_store, session_scope
    from strop.store.schema import Model as StoreModel, Run as StoreRun
    url = sdk_env.url
    alice = tinker.ServiceClient(base_url=url, api_key="tml-alice")
    mine = alice.create_lora_training_client(base_model=MODEL, rank=4).result()
    shared = mine.save_state("to-share").result().path
    tinker.RestClient(base_url=url, api_key="tml-alice").publish_checkpoint_from_tinker_path(shared).result()
    bob = tinker.ServiceClient(base_url=url, api_key="tml-bob")
    theirs = bob.create_training_client_from_state(shared).result()
    theirs.forward_backward([sft_datum([3, 1, 4, 1, 5, 9])], "cross_entropy").result()
    theirs.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    bobs = theirs.save_weights_for_sampler("bobs").result().path
    root = sdk_env.app.state.service.store.root

    def served_by(training_run_id: str) -> list[str]:
        """The adapter folder each store run standing for `training_run_id` serves now (its model)."""
        with session_scope(open_store(), read_only=True) as s:
            runs = s.scalars(select(StoreRun).where(StoreRun.config_name == training_run_id)).all()
            return [s.get(StoreModel, r.model_id).adapter_path for r in runs]
    assert served_by(mine.model_id) == [str(root / "runs" / mine.model_id / "weights" / "to-share")]
    assert served_by(theirs.model_id) == [str(root / "runs" / theirs.model_id / "sampler_weights" / "bobs")]
    record = json.loads((root / "runs" / theirs.model_id / "run.json").read_text())
    publishers = json.loads((root / "runs" / mine.model_id / "run.json").read_text())
    assert record["owner"] != publishers["owner"] and record.get("storeRunId") != publishers["storeRunId"]
    assert record["loaded_from"] == shared and bobs.startswith(f"tinker://{theirs.model_id}/")
    for client in (alice, bob):
        client.close("success").result()


def test_a_slow_model_resolution_blocks_only_its_own_request_and_a_failure_is_remembered(tmp_path):
    """The resolver hook stands for a hub download that takes minutes: while it blocks, another tenant's requests
    are answered; when it fails, asking again is refused at once from memory (the resolver is not run again)."""
    from strop.errors import ModelNotFoundError
    from strop.models import DEFAULT_MODEL, resolve_model
    release, calls = threading.Event(), []

    def slow_hub(model_id: str):
        if model_id != DEFAULT_MODEL:
            return resolve_model(model_id)
        calls.append(model_id)
        release.wait(60)
        raise ModelNotFoundError(f"{model_id}: the hub did not answer")
    srv = start(tmp_path / "slowhub", resolve_model=slow_hub)
    body = {"tags": [], "user_metadata": None, "sdk_version": "x"}
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            alice, bob = {"X-API-Key": "tml-alice"}, {"X-API-Key": "tml-bob"}
            sid = http.post("/api/v1/create_session", headers=alice, json=body).json()["session_id"]
            answer = {}
            waiting = threading.Thread(target=lambda: answer.setdefault("r", http.post(
                "/api/v1/create_model", headers=alice,
                json={"session_id": sid, "model_seq_id": 0, "base_model": DEFAULT_MODEL})))
            waiting.start()
            while not calls:
                time.sleep(0.01)
            t0 = time.monotonic()
            with httpx.Client(base_url=srv.url, timeout=10) as other:
                assert other.post("/api/v1/create_session", headers=bob, json=body).status_code == 200
                assert other.get("/api/v1/training_runs", headers=bob).status_code == 200
            assert time.monotonic() - t0 < 5 and "r" not in answer      # answered while the download hangs
            release.set()
            waiting.join(30)
            assert answer["r"].status_code == 400 and "did not answer" in answer["r"].json()["detail"]
            again = http.post("/api/v1/create_model", headers=alice,
                              json={"session_id": sid, "model_seq_id": 1, "base_model": DEFAULT_MODEL})
            assert again.status_code == 400 and "remembered" in again.json()["detail"] and len(calls) == 1
    finally:
        release.set()
        srv.stop()


def test_run_folders_without_checkpoints_of_sessions_gone_are_reaped(tmp_path):
    service = TinkerService(tmp_path / "reap")
    try:
        live = service.create_session("owner", [], None)
        store = service.store
        for run_id in ("sgone:train:0", "sgone:train:1", f"{live.id}:train:0"):
            store.record_run(run_id, {"owner": "owner", "base_model": MODEL, "lora_rank": 2})
        (store.run_dir("sgone:train:1") / "weights" / "kept").mkdir(parents=True)
        assert service.reap_runs() == ["sgone:train:0"]
        assert sorted(p.name for p in (tmp_path / "reap" / "runs").iterdir()) == \
            sorted(["sgone:train:1", f"{live.id}:train:0"])
    finally:
        service.close()


def fb_body(loss_fn: str, inputs: dict, tokens: list[int]) -> bytes:
    from tinker.proto import tinker_public_pb2 as pb
    msg = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn=loss_fn)
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.asarray(tokens, np.int32).tobytes()
    for name, values in inputs.items():
        tensor = datum.loss_fn_inputs[name]
        tensor.dtype, tensor.shape[:] = 1, [len(values)]
        tensor.dense = np.asarray(values, np.float32).tobytes()
    return msg.SerializeToString()


def test_made_up_loss_inputs_are_refused_and_tensors_kept_compact():
    from strop.tinker_wire import codec
    limits = dict(vocab_size=100, max_tokens=10_000, max_datums=8)
    with pytest.raises(codec.WireError, match=r"loss_fn_inputs\['junk'\] is not an input of loss_fn "
                                              r"'cross_entropy'; it takes target_tokens, weights"):
        codec.read_forward_backward(fb_body("cross_entropy", {"weights": [1.0] * 3, "junk": [0.5] * 5000},
                                            [1, 2, 3]), **limits)
    _, _, data, *_ = codec.read_forward_backward(
        fb_body("importance_sampling", {"logprobs": [-0.5] * 3000, "advantages": [1.0] * 3000}, [1] * 3000),
        **limits)
    logprobs = data[0].loss_fn_inputs["logprobs"]
    assert isinstance(logprobs.data, np.ndarray) and logprobs.data.dtype == np.float32
    assert logprobs.data.nbytes == 4 * 3000 and float(logprobs.to_torch()[0]) == -0.5


def test_a_keys_queued_request_bytes_are_bounded(tmp_path):
    from strop.tinker_wire.codec import WireError
    service = TinkerService(tmp_path / "bytes", start_worker=False, queued_bytes_per_key=1000)
    try:
        alice, bob = (service.create_session(owner, [], None) for owner in ("alice", "bob"))
        first = service.submit(alice, "ForwardBackward", lambda: b"ok", cost=700)
        with pytest.raises(WireError, match="700 B|over its") as refused:
            service.submit(alice, "ForwardBackward", lambda: b"ok", cost=400)
        assert refused.value.status == 429 and "--queued-mib-per-key" in str(refused.value)
        service.submit(bob, "ForwardBackward", lambda: b"ok", cost=900)      # another key has its own budget
        service._run(service._next_training_job())                            # alice's first job runs ...
        assert service.future(first, "alice").done
        service.submit(alice, "ForwardBackward", lambda: b"ok", cost=400)   # ... and frees her budget
    finally:
        service.close()


def test_a_keys_unread_results_are_bounded_oldest_evicted_with_a_clear_error(tmp_path):
    service = TinkerService(tmp_path / "results", start_worker=False, result_bytes_per_key=1000)
    try:
        alice, bob = (service.create_session(owner, [], None) for owner in ("alice", "bob"))
        ids = [service.submit(alice, "Sample", lambda: b"x" * 400) for _ in range(3)]
        other = service.submit(bob, "Sample", lambda: b"y" * 900)
        for _ in range(4):
            service._run(service._next_training_job())
        oldest = service.future(ids[0], "alice")
        assert oldest.payload is None and "evicted unread" in oldest.error and "--results-mib-per-key" in oldest.error
        assert [service.future(i, "alice").payload for i in ids[1:]] == [b"x" * 400] * 2   # 800 B: kept
        assert service.future(other, "bob").payload == b"y" * 900         # another key's budget is its own
        assert service.result_bytes == {"alice": 800, "bob": 900}
    finally:
        service.close()


def test_sampling_batches_take_the_keys_in_turn_up_to_a_token_budget(tmp_path):
    from strop.tinker_wire.codec import WireError
    service = TinkerService(tmp_path / "fair", start_worker=False, sample_batch_tokens=1000,
                            queued_tokens_per_key=3000)
    try:
        alice, bob = (service.create_session(owner, [], None) for owner in ("alice", "bob"))
        big = [service.submit(alice, "Sample", lambda: b"a", sample={}, tokens=1000) for _ in range(3)]
        with pytest.raises(WireError, match="--queued-tokens-per-key") as refused:
            service.submit(alice, "Sample", lambda: b"a", sample={}, tokens=1)
        assert refused.value.status == 429
        small = service.submit(bob, "Sample", lambda: b"b", sample={}, tokens=1)
        batches = []
        while service.samples:
            with service.lock:
                batches.append([job.future.id for job in service._take_samples()])
        # bob's 1-token request comes in the second batch (after one of alice's), not after all three of hers
        assert batches == [[big[0]], [big[1], small], [big[2]]] or batches == [[big[0]], [small], [big[1]], [big[2]]]
    finally:
        service.close()



def test_a_long_request_is_served_a_chunk_at_a_time_and_another_key_waits_for_one_chunk(tmp_path):
    from strop.tinker_wire.service import Continue
    service = TinkerService(tmp_path / "chunks", start_worker=False, sample_batch_tokens=1000)
    try:
        alice, bob = (service.create_session(owner, [], None) for owner in ("alice", "bob"))
        ran = []

        def turn(name: str, left: int):
            def run():
                ran.append(name)
                return lambda: Continue(turn(name, left - 1), tokens=left * 1000, turn_tokens=1000) if left else name
            return run
        big = service.submit(alice, "Sample", turn("a", 2), sample={}, tokens=3000, turn_tokens=1000)
        small = service.submit(bob, "Sample", turn("b", 0), sample={}, tokens=1)
        batches = []
        while service.samples:
            before = len(ran)
            service._run_samples()
            batches.append(ran[before:])
        # bob's request waits for one chunk of alice's, not for her whole request; hers ends after its third chunk
        assert batches == [["a"], ["b"], ["a"], ["a"]]
        assert service.futures[big].payload == "a" and service.futures[small].payload == "b"
    finally:
        service.close()


def test_a_seeded_request_served_in_chunks_samples_what_it_samples_whole(sdk_env, tmp_path, monkeypatch):
    prompt = types.ModelInput.from_ints([5, 6, 7, 8, 9])
    params = types.SamplingParams(max_tokens=40, seed=99, temperature=1.0)

    def sample(url: str, sampling_params=params, n: int = 3):
        monkeypatch.setenv("TINKER_BASE_URL", url)
        client = tinker.ServiceClient()
        sampler = client.create_sampling_client(base_model=MODEL)
        out = sampler.sample(prompt, n, sampling_params, include_prompt_logprobs=True).result()
        client.close("success").result()
        return out

    whole = sample(sdk_env.url)
    cut = start(tmp_path / "cut", sample_batch_tokens=16)      # 16 tokens a turn: chunks of 16, 16 and 8 tokens
    try:
        chunked = sample(cut.url)
        assert len(cut.app.state.service.sample_batches) >= 3
        # a stop string that begins in the first chunk and ends in the second is found where the whole run finds it
        from strop.tokenizer_utils import get_tokenizer
        from strop.models import resolve_model
        decode = get_tokenizer(str(resolve_model(MODEL))).decode
        text = decode(list(whole.sequences[0].tokens[14:18]))
        stopping = types.SamplingParams(max_tokens=40, seed=99, temperature=1.0, stop=[text])
        stopped_whole, stopped_cut = sample(sdk_env.url, stopping, 1), sample(cut.url, stopping, 1)
    finally:
        cut.stop()
    assert [s.tokens for s in chunked.sequences] == [s.tokens for s in whole.sequences]
    assert len({tuple(s.tokens) for s in whole.sequences}) == 3      # three different samples
    assert all(len(s.tokens) == 40 for s in chunked.sequences)
    for a, b in zip(chunked.sequences, whole.sequences):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert chunked.prompt_logprobs[1:] == pytest.approx(whole.prompt_logprobs[1:], abs=1e-4)
    assert stopped_cut.sequences[0].stop_reason == stopped_whole.sequences[0].stop_reason == "stop"
    assert stopped_cut.sequences[0].tokens == stopped_whole.sequences[0].tokens
    assert len(stopped_whole.sequences[0].tokens) <= 18
