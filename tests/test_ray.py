"""Runs on a real Ray cluster: a head node and a second worker node started with `ray start` on loopback
(strop.cluster.local), sampler replicas and environment workers placed on it, compared with the same work done
in one process."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import psutil
import pytest
import torch

from loopback import closed_port
from strop import types
from strop.cluster import RaySettings
from strop.errors import StropError
from strop.rl import GRPOConfig, run_grpo
from strop.tool_calls import ToolCall
from test_grpo import tiny_config, write_bundle

ray = pytest.importorskip("ray", reason="the dev install has ray: pip install -e \".[dev]\"")


@pytest.fixture(scope="module")
def cluster():
    from strop.cluster.local import LocalCluster

    # 4 logical CPUs a node (the machine has 2 cores): a run's trainer, 2 replicas and 2 workers fit on either node
    with LocalCluster(nodes=2, cpus_per_node=4) as running:
        yield running
        ray.shutdown()  # this process drove it


@pytest.fixture()
def varied(tmp_path):
    return write_bundle(tmp_path / "lengthy", "def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                              "extra_info=None):\n    return (len(solution_str) % 7) / 7.0\n")


def safe_open_tensors(folder):
    from safetensors.torch import load_file
    return load_file(str(folder / "adapter_model.safetensors"))


def rollouts(run_dir):
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def test_settings_are_checked_before_anything_loads():
    assert RaySettings.problems({"address": "auto", "samplers": 2, "envWorkers": 3}) == []
    problems = RaySettings.problems({"address": "nowhere", "samplers": 0, "envworkers": 1})
    assert len(problems) == 3 and "HOST:PORT" in problems[1] and "known fields" in problems[0]
    assert RaySettings.problems({"address": "10.0.0.5:70000"})  # no such port
    assert RaySettings.problems({"address": "10.0.0.5:6379\n"})  # a line break is not part of an address
    with pytest.raises(StropError, match="ray: samplers: must be an integer"):
        GRPOConfig(base_model="strop/tiny-random", ray={"address": "auto", "samplers": "2"})
    with pytest.raises(StropError, match="max_off_policy_steps"):
        GRPOConfig(base_model="strop/tiny-random", max_off_policy_steps=17)


def _strop(*args, timeout=60):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "strop.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - started


def test_a_wrong_address_is_one_clear_error_within_seconds(tiny_model_dir, tmp_path):
    port = closed_port()
    done, seconds = _strop("train", "--base-model", str(tiny_model_dir), "--steps", "1", "--ray-address",
                           f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "run"), "--quiet")
    assert done.returncode == 1 and seconds < 30, (seconds, done.stderr)
    assert f"no Ray cluster at 127.0.0.1:{port}: nothing listens there" in done.stderr
    assert "Traceback" not in done.stderr

    class Web(BaseHTTPRequestHandler):  # something listens, but it is not Ray
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = HTTPServer(("127.0.0.1", 0), Web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done, seconds = _strop("train", "--base-model", str(tiny_model_dir), "--steps", "1", "--ray-address",
                               f"127.0.0.1:{server.server_port}", "--run-dir", str(tmp_path / "run2"), "--quiet")
    finally:
        server.shutdown()
    assert done.returncode == 1 and seconds < 40, (seconds, done.stderr)
    assert "does not speak Ray's protocol" in done.stderr
    done, _ = _strop("train", "--samplers", "2", "--steps", "1")
    assert done.returncode == 1 and "give --ray-address too" in done.stderr


def test_sampler_replicas_and_grader_workers_do_what_one_process_does(cluster, tiny_model_dir, varied, tmp_path):
    broken = write_bundle(tmp_path / "broken", "def compute_score(**kw):\n    raise RuntimeError('boom')\n")
    config = tiny_config(tiny_model_dir, varied, max_steps=3, save_every=3, max_completion_length=12)
    config.reward_terms = [*config.reward_terms, {"name": "broken", "weight": 0.0, "grader": str(broken)}]
    config.max_reward_error_fraction = 0.9
    here = run_grpo(config, tmp_path / "here", progress=False)
    config.ray = {"address": cluster.address, "samplers": 2, "envWorkers": 2}  # a dataset's environment: graders
    there = run_grpo(config, tmp_path / "there", progress=False)
    assert [m["reward"] for m in here.metrics] == [m["reward"] for m in there.metrics]
    assert [m["rewardErrors"] for m in there.metrics] == [8, 8, 8]  # the broken grader fails there as here
    assert [r["errors"] for r in rollouts(tmp_path / "here")] == [r["errors"] for r in rollouts(tmp_path / "there")]
    assert any(m["rewardStd"] > 0 for m in here.metrics)  # rewards that vary: a real comparison
    assert [r["completion"] for r in rollouts(tmp_path / "here")] == [r["completion"] for r in rollouts(tmp_path / "there")]
    for a, b in zip(here.metrics, there.metrics):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["klSampleTrain"] == pytest.approx(a["klSampleTrain"], abs=1e-6)
    facts = json.loads((tmp_path / "there" / "engine.json").read_text())
    replicas = facts["samplerReplicas"]
    assert len(replicas) == 2 and len({r["node"] for r in replicas}) == 2  # one on each node
    assert len(facts["rayCluster"]["nodes"]) == 2 and facts["rayCluster"]["cpus"] == 8
    assert facts["trainer"]["node"] in {r["node"] for r in replicas}  # the trainer on an actor of its own
    here_final = safe_open_tensors(tmp_path / "here" / "final")
    there_final = safe_open_tensors(tmp_path / "there" / "final")  # sent back from the trainer's actor
    assert here_final.keys() == there_final.keys()
    # the trainer's actor sums in another order (its own threads): measured 1.3e-5 apart after 3 AdamW steps at
    # lr 1e-2, on weights up to 0.14 (Adam divides by the gradients' own small scale, so it magnifies such drift)
    worst = max((here_final[k] - there_final[k]).abs().max().item() for k in here_final)
    assert worst < 1e-4, worst
    assert len(facts["graderWorkers"]) == 2


def test_environment_workers_play_what_one_process_plays(cluster, tiny_model_dir, tmp_path):
    env = {"name": "finance-sql", "options": {"seed": 0, "max_turns": 2}}
    config = GRPOConfig(base_model=str(tiny_model_dir), environment=env, batch_size=2, group_size=2, max_steps=2,
                        max_completion_length=10, save_every=2, seed=0)
    here = run_grpo(config, tmp_path / "here", progress=False)
    config.ray = {"address": cluster.address, "samplers": 2, "envWorkers": 2}
    there = run_grpo(config, tmp_path / "there", progress=False)
    assert [m["reward"] for m in here.metrics] == [m["reward"] for m in there.metrics]
    assert [(r["transcript"], r["state"]) for r in rollouts(tmp_path / "here")] == \
        [(r["transcript"], r["state"]) for r in rollouts(tmp_path / "there")]
    facts = json.loads((tmp_path / "there" / "engine.json").read_text())
    assert [w["environments"] for w in facts["envWorkers"]] == [2, 2]


def test_remote_environments_answer_tool_calls_as_local_ones(cluster):
    """Scripted episodes (the demonstrations' own tool calls) against finance-sql in a worker and here."""
    from strop.cluster.envs import EnvWorkers
    from strop.envs import get_env
    from strop.envs.finance_demos import play_demonstration

    local = get_env("finance-sql", seed=3)
    workers = EnvWorkers({"name": "finance-sql", "options": {"seed": 3}}, 3, settings=RaySettings(
        address=cluster.address, env_workers=2))
    try:
        assert workers.envs[0].tools() == local.tools()
        for i, task in enumerate(local.tasks("train", limit=3)):
            mistake = i == 1  # one episode recovers from a wrong query
            here = play_demonstration(local, task, mistake=mistake, rng=random.Random(i))
            there = play_demonstration(workers.envs[i], task, mistake=mistake, rng=random.Random(i))
            assert here == there and here["reward"] > 0
        assert workers.envs[0].step(ToolCall("no_such_tool", {})).observation.content == \
            local.step(ToolCall("no_such_tool", {})).observation.content
    finally:
        workers.close()
        local.close()


def test_a_cluster_too_small_is_one_error(cluster, tiny_model_dir):
    from strop.cluster.samplers import RaySamplerEngine
    started = time.monotonic()
    with pytest.raises(StropError, match="need 9 CPUs and 0 GPUs, and the Ray cluster has 8 CPUs"):
        RaySamplerEngine(str(tiny_model_dir), tiny_model_dir, settings=RaySettings(address=cluster.address, samplers=9))
    assert time.monotonic() - started < 30


def test_a_killed_replica_has_its_share_run_again(cluster, tiny_model_dir, capsys):
    from strop.cluster.samplers import RaySamplerEngine
    from strop.engine.sampler import SampleRequest, SamplerEngine
    from strop.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    requests = [SampleRequest(prompt_tokens=[5 + i, 6, 7], num_samples=8,
                              params=types.SamplingParams(max_tokens=200, seed=i)) for i in range(32)]
    expected = SamplerEngine(tiny_model_dir, tokenizer=tokenizer).generate(requests)
    engine = RaySamplerEngine(str(tiny_model_dir), tiny_model_dir, settings=RaySettings(
        address=cluster.address, samplers=2), sampler="strop", dtype="float32")
    try:
        victim = psutil.Process(engine.facts["samplerReplicas"][1]["pid"])
        idle = sum(victim.cpu_times()[:2])

        def kill_mid_batch():  # once the replica has computed 0.1 s of its share: it is generating
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(victim.cpu_times()[:2]) - idle < 0.1:
                time.sleep(0.005)
            victim.kill()
        killer = threading.Thread(target=kill_mid_batch)
        killer.start()
        got = engine.generate(requests)
        killer.join()
        assert engine.retries >= 1 and "a sampler replica died" in capsys.readouterr().err
        assert [[s.tokens for s in r.sequences] for r in got] == [[s.tokens for s in r.sequences] for r in expected]
        again = engine.generate(requests[:4])  # Ray restarted the replica: both serve again
        assert [[s.tokens for s in r.sequences] for r in again] == \
            [[s.tokens for s in r.sequences] for r in expected[:4]]
    finally:
        engine.close()


def test_a_run_whose_replica_is_killed_finishes_with_every_rollout(cluster, tiny_model_dir, varied, tmp_path):
    """kill -9 one sampler replica once the run has made a step: the run goes on (the dead replica's share runs
    on the other while Ray restarts it) and every step's rewards are those of the run in one process."""
    config = tiny_config(tiny_model_dir, varied, max_steps=6, save_every=6, max_completion_length=48, batch_size=4)
    here = run_grpo(config, tmp_path / "here", progress=False)
    config.ray = {"address": cluster.address, "samplers": 2}
    done = {}
    thread = threading.Thread(target=lambda: done.update(result=run_grpo(config, tmp_path / "there", progress=False)))
    thread.start()
    metrics, engine = tmp_path / "there" / "metrics.jsonl", tmp_path / "there" / "engine.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.05)
    os.kill(json.loads(engine.read_text())["samplerReplicas"][0]["pid"], signal.SIGKILL)
    thread.join(timeout=300)
    assert "result" in done, "the run did not finish"
    assert [m["reward"] for m in done["result"].metrics] == [m["reward"] for m in here.metrics]


def test_a_ray_run_killed_mid_run_resumes_from_its_checkpoint(cluster, tiny_model_dir, varied, tmp_path):
    """kill -9 the driver of a run on the cluster (its actors go with it), then the same command: the checkpoint
    goes to a fresh trainer actor, and every step's reward is that of an uninterrupted run in one process."""
    def command(run_dir, *ray):
        return [sys.executable, "-m", "strop.cli.main", "train", "--base-model", str(tiny_model_dir), "--steps", "6",
                "--group-size", "4", "--batch-size", "2", "--max-tokens", "8", "--rank", "4", "--lr", "0.01",
                "--save-every", "2", "--reward", str(varied), "--run-dir", str(run_dir), "--quiet", *ray]

    on_ray = ["--ray-address", cluster.address, "--samplers", "2"]
    run_dir, metrics = tmp_path / "killed", tmp_path / "killed" / "metrics.jsonl"
    proc = subprocess.Popen(command(run_dir, *on_ray), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(metrics.read_text().splitlines() if metrics.exists() else []) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= len(metrics.read_text().splitlines()) < 6, "the run should have died mid-way"
    resumed = subprocess.run(command(run_dir, *on_ray), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resuming" in resumed.stderr, resumed.stderr
    straight = subprocess.run(command(tmp_path / "straight"), capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    expected = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert [r["reward"] for r in rows] == pytest.approx([r["reward"] for r in expected], abs=1e-6)


def test_a_run_started_on_the_cluster_records_it(cluster, workspace, capsys):  # noqa: F811
    from test_control import descriptor, run

    path = descriptor(workspace, **{"config.rlHyperparams.maxSteps": 2, "config.rlHyperparams.groupSize": 2,
                                    "execution.ray": {"samplers": 2, "trainers": 2}})
    code, out, err = run(capsys, "runs", "start", "-f", path, "--dry-run", "--ray-address", f"127.0.0.1:{closed_port()}")
    assert code == 1 and "$.execution.ray.address: no Ray cluster at" in err
    run_id = run(capsys, "runs", "start", "-f", path, "--ray-address", cluster.address, "--jq", ".runId")[1].strip()
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    info = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])
    assert info["pinned"]["ray"] == {"address": cluster.address, "samplers": 2, "envWorkers": 0, "trainers": 2}
    assert len(info["cluster"]["samplerReplicas"]) == 2 and len(info["cluster"]["rayCluster"]["nodes"]) == 2
    assert len(info["cluster"]["trainer"]["replicas"]) == 2
    shown = run(capsys, "runs", "get", run_id)[1]
    assert "Ray cluster" in shown and "2 sampler replicas" in shown and "2 data-parallel trainers (gloo" in shown


def test_an_environment_evaluation_spreads_over_the_cluster(cluster, tiny_model_dir):
    command = ["envs", "eval", "finance-sql", "--model", str(tiny_model_dir), "--limit", "3", "--max-tokens", "8",
               "--splits", "eval-single", "-o", "json"]
    here, _ = _strop(*command, timeout=300)
    there, _ = _strop(*command, "--ray-address", cluster.address, "--samplers", "2", "--env-workers", "2", timeout=300)
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert json.loads(here.stdout)["splits"] == json.loads(there.stdout)["splits"]
    assert len(json.loads(here.stdout)["splits"]["eval-single"]["episodes"]) == 3
    wrong, seconds = _strop("evaluations", "start", "--model", str(tiny_model_dir), "--dataset", "x/y", "--grader",
                            "builtin:gsm8k", "--ray-address", f"127.0.0.1:{closed_port()}")
    assert wrong.returncode == 1 and "--ray-address: no Ray cluster at" in wrong.stderr and seconds < 30


from test_control import home, workspace  # noqa: E402,F401 - the control-plane fixtures, shared


def _is_datums(n: int, seed: int) -> list[types.Datum]:
    """importance_sampling datums of varied lengths with made-up sampler logprobs and advantages."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 10 + 3 * i
        ids = torch.randint(3, 200, (length + 1,), generator=g)
        prompt = length // 3
        advantages = torch.zeros(length)
        advantages[prompt:] = float(torch.randn((), generator=g))
        logprobs = torch.zeros(length)
        logprobs[prompt:] = -torch.rand(length - prompt, generator=g) * 4
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1].tolist()), loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(ids[1:]),
            "logprobs": types.TensorData.from_torch(logprobs),
            "advantages": types.TensorData.from_torch(advantages)}))
    return out


def test_data_parallel_trainers_take_the_one_trainers_steps(cluster, tiny_model_dir):
    from strop.cluster.trainer import RemoteTrainer
    from strop.engine.trainer import LoraTrainer

    one = LoraTrainer(tiny_model_dir, rank=4, seed=3, compute_dtype=torch.float32)
    settings = RaySettings(address=cluster.address, trainers=2)
    two = RemoteTrainer("strop/tiny-random", tiny_model_dir, settings=settings, dtype="float32", rank=4, seed=3)
    try:
        assert two.facts["dataParallel"] == 2 and two.facts["backend"] == "gloo"
        assert len({r["node"] for r in two.facts["replicas"]}) == 2  # one on each node
        adam = types.AdamParams(learning_rate=1e-2)
        for step in range(3):
            batches = [_is_datums(5, seed=10 * step), _is_datums(3, seed=10 * step + 1)]  # two calls accumulate
            for batch in batches:
                a = one.forward_backward(batch, "importance_sampling")
                b = two.forward_backward(batch, "importance_sampling")
                assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-5, abs=1e-6)
                assert b.metrics["tokens:sum"] == a.metrics["tokens:sum"]
                for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):  # each datum's output, in its place
                    assert torch.allclose(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5)
            got, want = two.optim_step(adam), one.optim_step(adam)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
            assert got["grad_norm"] > 0
        first, second = two.replica_weights()
        assert all(torch.equal(first[k], second[k]) for k in first)  # the replicas never drift apart
        local = one.lora_state_dict()
        worst = max((local[k] - first[k]).abs().max().item() for k in local)
        assert 0 < max(v.abs().max().item() for v in local.values()) and worst < 1e-4, worst
        # a datum that does not fit its loss is refused before any replica takes a gradient from the batch
        bad = _is_datums(2, seed=99)
        del bad[1].loss_fn_inputs["advantages"]
        with pytest.raises(StropError, match="datum 1: .*missing"):
            two.forward_backward(bad, "importance_sampling")
        held = two.forward(_is_datums(4, seed=5), "importance_sampling")  # forward too: shares, no gradient
        assert held.metrics["loss:sum"] == pytest.approx(
            one.forward(_is_datums(4, seed=5), "importance_sampling").metrics["loss:sum"], rel=1e-4, abs=1e-5)
    finally:
        two.close()


def test_a_grpo_run_with_data_parallel_trainers_matches_one_process(cluster, tiny_model_dir, varied, tmp_path):
    config = tiny_config(tiny_model_dir, varied, max_steps=3, save_every=3, max_completion_length=12, batch_size=4)
    here = run_grpo(config, tmp_path / "here", progress=False)
    config.ray = {"address": cluster.address, "samplers": 1, "trainers": 2}
    there = run_grpo(config, tmp_path / "there", progress=False)
    assert [m["reward"] for m in here.metrics] == [m["reward"] for m in there.metrics]
    assert any(m["rewardStd"] > 0 for m in here.metrics)
    for a, b in zip(here.metrics, there.metrics):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    facts = json.loads((tmp_path / "there" / "engine.json").read_text())
    assert facts["trainer"]["dataParallel"] == 2 and len(facts["trainer"]["replicas"]) == 2
    here_final, there_final = (safe_open_tensors(tmp_path / side / "final") for side in ("here", "there"))
    worst = max((here_final[k] - there_final[k]).abs().max().item() for k in here_final)
    assert worst < 1e-4, worst


def test_strop_train_sft_with_data_parallel_trainers(cluster, tiny_model_dir, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "completion": f"{i + 1}, since {i} and one "
                                        f"more make {i + 1}"}) + "\n" for i in range(24)))
    common = ["train", "--method", "sft", "--base-model", str(tiny_model_dir), "--dataset", str(data), "--steps", "4",
              "--batch-size", "6", "--lr", "1e-2", "--rank", "4", "--dtype", "float32", "--quiet", "-o", "json"]
    here, _ = _strop(*common, "--run-dir", str(tmp_path / "here"), timeout=300)
    there, _ = _strop(*common, "--run-dir", str(tmp_path / "there"), "--ray-address", cluster.address,
                      "--trainers", "2", timeout=300)
    assert here.returncode == 0 and there.returncode == 0, (here.stderr, there.stderr)
    a, b = json.loads(here.stdout), json.loads(there.stdout)
    assert b["heldOutLossAfter"] < b["heldOutLossBefore"] - 0.1  # it learned
    for key in ("firstLoss", "lastLoss", "heldOutLossBefore", "heldOutLossAfter"):
        assert b[key] == pytest.approx(a[key], abs=1e-4), key
    facts = json.loads((tmp_path / "there" / "engine.json").read_text())
    assert facts["trainer"]["dataParallel"] == 2
    done, _ = _strop("train", "--method", "sft", "--dataset", str(data), "--trainers", "2")
    assert done.returncode == 1 and "--trainers places trainers on a Ray cluster: give --ray-address too" in done.stderr


def test_a_data_parallel_replica_that_dies_fails_the_step_and_stops_the_others(cluster, tiny_model_dir):
    from strop.cluster.connect import ClusterError
    from strop.cluster.trainer import RemoteTrainer

    settings = RaySettings(address=cluster.address, trainers=2)
    two = RemoteTrainer("strop/tiny-random", tiny_model_dir, settings=settings, dtype="float32", rank=4, seed=3)
    first, second = (r["pid"] for r in two.facts["replicas"])
    try:
        two.forward_backward(_is_datums(4, seed=1), "importance_sampling")
        os.kill(second, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ClusterError, match="died .*run the same command again to resume"):
            two.optim_step(types.AdamParams(learning_rate=1e-2))  # the all-reduce would wait for it for ever
        assert time.monotonic() - started < 60
        deadline = time.monotonic() + 30
        while psutil.pid_exists(first) and psutil.Process(first).status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    finally:
        two.close()


GPU_CLUSTER_SCRIPT = r"""
import json, sys
from strop.cluster import RaySettings
from strop.cluster.local import LocalCluster
from strop.cluster.samplers import RaySamplerEngine
from strop.cluster.trainer import RemoteTrainer

model = sys.argv[1]
out = {}
with LocalCluster(nodes=1, cpus_per_node=4, gpus_per_node=1) as cluster:
    import ray
    settings = RaySettings(address=cluster.address, samplers=1)
    for asked in (0, None):
        trainer = RemoteTrainer(model, model, settings=settings, dtype="float32", rank=4, run_gpus=asked)
        samplers = RaySamplerEngine(model, model, settings=settings, dtype="float32", reserved_gpus=trainer.gpus,
                                    run_gpus=asked)
        env = ray.get(trainer.actors[0].__ray_call__.remote(lambda self: __import__("os").environ.get("STROP_DEVICE")))
        out[str(asked)] = {"trainerGpus": trainer.gpus, "trainerDevice": trainer.facts["device"],
                           "freeGpus": ray.available_resources().get("GPU", 0), "trainerEnv": env,
                           "samplerNode": samplers.facts["samplerReplicas"][0]["node"]}
        samplers.close()
        trainer.close()
    ray.shutdown()
print("RESULT " + json.dumps(out))
"""


def test_execution_gpus_0_keeps_the_replicas_off_a_clusters_gpus(tiny_model_dir):
    """A one-node cluster that declares a GPU (as a GPU machine's would): by default the trainer takes it; a run
    whose execution.gpus is 0 leaves it free and computes on the CPU (STROP_DEVICE=cpu in the actors), as the
    same descriptor does on one machine. Its own cluster in a subprocess: a process joins one cluster."""
    done = subprocess.run([sys.executable, "-c", GPU_CLUSTER_SCRIPT, str(tiny_model_dir)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    asked_none, asked_zero = result["None"], result["0"]
    assert asked_none["trainerGpus"] == 1 and asked_none["freeGpus"] == 0  # the cluster's GPU was taken
    assert asked_zero["trainerGpus"] == 0 and asked_zero["freeGpus"] == 1  # left free: trainer and sampler on CPUs
    assert asked_zero["trainerEnv"] == "cpu" and asked_zero["trainerDevice"] == "cpu"
    assert asked_none["trainerEnv"] is None
