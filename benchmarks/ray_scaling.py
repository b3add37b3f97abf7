"""Scaling out on Ray, measured on a real cluster: a head node and a second node started with `ray start` on this
machine's loopback (strop.cluster.local). Two parts, each compared side by side in one run:

1. Environment workers. finance-sql episodes whose every tool call waits --latency-ms first (a database across a
   network: benchmarks/_slow_sql.py): the scripted agent's calls (list the tables, describe them, query, submit;
   a quarter recover from a wrong query first). Played in this process one call at a time (how environments in
   the trainer's process run), then on 1, 2 and 4 environment workers, every episode's calls in flight at once as
   the rollout loop makes them (`strop.rl.rollouts.play`). Every configuration must give the same rewards.
2. Off-policy steps. The same GRPO run on the cluster (2 sampler replicas) with execution.maxOffPolicySteps 0
   and 1, its grader a remote verifier that waits --grader-ms a call: seconds per step, and `overlapSeconds`,
   the sampling that ran while the previous step trained.
3. Data-parallel trainers. The same supervised steps in this process, on one trainer actor and on two
   data-parallel ones (gloo): seconds for forward_backward and optim_step (which holds the all-reduce), and how
   far each final adapter is from the in-process one. On one 2-core machine two trainers share the cores, so this
   measures what data parallelism costs, not what it gains on nodes of their own.

    python benchmarks/ray_scaling.py                  # defaults (about 3 minutes here)
    python benchmarks/ray_scaling.py --quick          # a smoke run

The CPU's kernels and the cluster's nodes are printed first; the last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def play_all(envs, tasks, concurrent: bool) -> list[float]:
    from strop.envs.finance_demos import play_demonstration

    def one(i):
        demo = play_demonstration(envs[i], tasks[i], mistake=i % 4 == 1, rng=random.Random(i))
        return demo["reward"]
    if not concurrent:
        return [one(i) for i in range(len(tasks))]
    with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        return list(pool.map(one, range(len(tasks))))


def env_scaling(address: str, args) -> list[dict]:
    from strop.cluster import RaySettings
    from strop.cluster.envs import EnvWorkers
    from strop.envs import get_env

    name, options = "_slow_sql:SlowFinanceSQL", {"seed": 0, "latency_ms": args.latency_ms}
    local = [get_env(name, **options) for _ in range(args.episodes)]
    tasks = local[0].tasks("train", limit=args.episodes)
    rows = []
    t0 = time.perf_counter()
    reference = play_all(local, tasks, concurrent=False)
    rows.append({"where": "this process, one call at a time", "workers": 0,
                 "seconds": time.perf_counter() - t0, "rewards": reference})
    for n in args.workers:
        workers = EnvWorkers({"name": name, "options": options}, args.episodes,
                             settings=RaySettings(address=address, env_workers=n))
        try:
            t0 = time.perf_counter()
            rewards = play_all(workers.envs, tasks, concurrent=True)
            rows.append({"where": f"{n} environment worker{'s' if n > 1 else ''}", "workers": n,
                         "seconds": time.perf_counter() - t0, "rewards": rewards})
        finally:
            workers.close()
    for env in local:
        env.close()
    base = rows[0]["seconds"]
    for row in rows:
        row["speedup"] = base / row["seconds"]
        row["sameRewards"] = row.pop("rewards") == reference
    return rows


def off_policy(address: str, args, out: Path) -> list[dict]:
    from strop.rl import GRPOConfig, run_grpo

    bundle = out / "verifier"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "reward.py").write_text(
        "import time\n\ndef compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
        f"    time.sleep({args.grader_ms / 1000.0})\n    return (len(solution_str) % 7) / 7.0\n")
    rows = []
    for k in (0, 1):
        config = GRPOConfig(base_model=args.model, dataset="synthetic:add", batch_size=args.prompts,
                            group_size=args.group, max_steps=args.steps, max_completion_length=args.tokens,
                            learning_rate=1e-4, lora_rank=8, save_every=args.steps, seed=0,
                            reward_terms=[{"name": "verifier", "weight": 1.0, "grader": str(bundle)}],
                            ray={"address": address, "samplers": 2}, max_off_policy_steps=k)
        t0 = time.perf_counter()
        result = run_grpo(config, out / f"offpolicy-{k}", progress=False)
        wall = time.perf_counter() - t0
        steady = result.metrics[1:] or result.metrics
        rows.append({"maxOffPolicySteps": k, "runSeconds": wall,
                     "stepSeconds": statistics.fmean(m["stepSeconds"] for m in steady),
                     "sampleSeconds": statistics.fmean(m["sampleSeconds"] for m in steady),
                     "trainSeconds": statistics.fmean(m["trainSeconds"] for m in steady),
                     "overlapSeconds": sum(m.get("overlapSeconds") or 0.0 for m in result.metrics),
                     "offPolicySteps": [m.get("offPolicySteps", 0) for m in result.metrics],
                     "reward": [round(m["reward"], 4) for m in result.metrics]})
    return rows


def _datums(n: int, tokens: int, vocab: int, seed: int = 0) -> list:
    import torch

    from strop import types
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = tokens - 16 * (i % 4)  # a spread of lengths, as a batch of transcripts has
        ids = torch.randint(3, vocab, (length + 1,), generator=g)
        weights = torch.zeros(length)
        weights[length // 3:] = 1.0    # the prompt's third untrained, as in a transcript
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1].tolist()), loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(ids[1:]), "weights": types.TensorData.from_torch(weights)}))
    return out


def data_parallel(address: str, args) -> list[dict]:
    """The same supervised steps (forward_backward on a batch, then optim_step) in this process, on one trainer
    actor, and on 2 data-parallel trainer actors (a node each, gloo): seconds, and how far each final adapter is
    from the in-process one."""
    from transformers import AutoConfig

    from strop import types
    from strop.cluster import RaySettings
    from strop.cluster.trainer import RemoteTrainer
    from strop.engine.precision import torch_dtype
    from strop.engine.trainer import LoraTrainer
    from strop.models import resolve_model

    path = resolve_model(args.model)
    datums = _datums(args.dp_datums, args.dp_tokens, AutoConfig.from_pretrained(str(path)).vocab_size)
    adam = types.AdamParams(learning_rate=1e-4)
    makers = [("this process", lambda: LoraTrainer(path, rank=32, seed=0, compute_dtype=torch_dtype(args.dtype))),
              *((f"{n} trainer actor{'s' if n > 1 else ''}" + (" (data-parallel)" if n > 1 else ""),
                 lambda n=n: RemoteTrainer(args.model, path, settings=RaySettings(address=address, trainers=n),
                                           dtype=args.dtype, rank=32, seed=0)) for n in (1, 2))]
    rows, reference = [], None
    for where, make in makers:
        trainer = make()
        try:
            forward, optim, losses = [], [], []
            for _ in range(args.dp_steps):
                t0 = time.perf_counter()
                losses.append(trainer.forward_backward(datums, "cross_entropy").metrics["loss:sum"])
                t1 = time.perf_counter()
                trainer.optim_step(adam)
                forward.append(t1 - t0)
                optim.append(time.perf_counter() - t1)
                print(f"  {where}: step {len(optim)} forward_backward {forward[-1]:.2f} s, optim_step "
                      f"{optim[-1]:.3f} s", flush=True)
            weights = trainer.lora_state_dict() if isinstance(trainer, LoraTrainer) else trainer.replica_weights()[0]
        finally:
            getattr(trainer, "close", lambda: None)()
        reference = reference or weights
        rows.append({"where": where, "forwardBackwardSeconds": statistics.fmean(forward[1:] or forward),
                     "optimStepSeconds": statistics.fmean(optim[1:] or optim), "losses": losses,
                     "adapterMaxDiff": max((weights[k] - reference[k]).abs().max().item() for k in reference)})
    return rows


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--episodes", type=int, default=32, help="finance-sql episodes (default: %(default)s)")
    cli.add_argument("--latency-ms", type=float, default=50.0, help="wait before each tool call (default: %(default)s)")
    cli.add_argument("--workers", default="1,2,4", help="environment workers to try (default: %(default)s)")
    cli.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                     help="GRPO part's model (default: %(default)s)")
    cli.add_argument("--steps", type=int, default=6)
    cli.add_argument("--prompts", type=int, default=4)
    cli.add_argument("--group", type=int, default=4)
    cli.add_argument("--tokens", type=int, default=32)
    cli.add_argument("--grader-ms", type=float, default=100.0, help="the verifier's wait per call (default: %(default)s)")
    cli.add_argument("--dp-datums", type=int, default=4, help="datums a data-parallel step (default: %(default)s)")
    cli.add_argument("--dp-tokens", type=int, default=256, help="tokens of the longest (default: %(default)s)")
    cli.add_argument("--dp-steps", type=int, default=3)
    cli.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                     help="what the data-parallel part's trainers compute in (default: %(default)s)")
    cli.add_argument("--parts", default="1,2,3", help="which parts to run (default: all three)")
    cli.add_argument("--quick", action="store_true", help="a smoke run: 8 episodes, 1-2 workers, 3 steps of the tiny "
                                                          "random model")
    cli.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="strop-ray-bench-")))
    args = cli.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    if args.quick:
        args.episodes, args.workers, args.steps, args.model, args.dp_steps = 8, [1, 2], 3, "strop/tiny-random", 2
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))

    import torch

    from strop.cluster.connect import cluster_facts, connect
    from strop.cluster.local import LocalCluster
    from strop.engine.precision import kernels

    print(f"CPU kernels {kernels()}, {os.cpu_count()} CPUs, torch {torch.__version__}", flush=True)
    with LocalCluster(nodes=2, cpus_per_node=2) as cluster:
        connect(cluster.address)
        facts = cluster_facts()
        print(f"Ray {facts['rayVersion']} cluster at {cluster.address}: {len(facts['nodes'])} nodes, "
              f"{facts['cpus']:g} CPUs", flush=True)
        parts = {p.strip() for p in args.parts.split(",")}
        envs = steps = trainers = None
        if "1" in parts:
            envs = env_scaling(cluster.address, args)
            print(f"\n{args.episodes} finance-sql episodes, {args.latency_ms:g} ms per tool call:")
            print(f"{'where':<36}{'seconds':>9}{'speedup':>9}  same rewards")
            for row in envs:
                print(f"{row['where']:<36}{row['seconds']:>9.2f}{row['speedup']:>8.2f}x  {row['sameRewards']}")
        if "2" in parts:
            steps = off_policy(cluster.address, args, args.out)
            print(f"\nGRPO on {args.model}, {args.prompts}x{args.group} rollouts a step, 2 sampler replicas, a "
                  f"verifier of {args.grader_ms:g} ms a call, {args.steps} steps (means over steps 1..):")
            print(f"{'maxOffPolicySteps':<19}{'run s':>8}{'step s':>8}{'sample s':>10}{'train s':>9}{'overlap s':>11}")
            for row in steps:
                print(f"{row['maxOffPolicySteps']:<19}{row['runSeconds']:>8.1f}{row['stepSeconds']:>8.2f}"
                      f"{row['sampleSeconds']:>10.2f}{row['trainSeconds']:>9.2f}{row['overlapSeconds']:>11.2f}")
        if "3" in parts:
            trainers = data_parallel(cluster.address, args)
            print(f"\nSupervised steps of {args.model} ({args.dtype}), {args.dp_datums} datums of <= {args.dp_tokens} "
                  f"tokens a step, {args.dp_steps} steps (means over steps 1..):")
            print(f"{'where':<36}{'fwd+bwd s':>10}{'optim s':>9}{'adapter vs here':>17}")
            for row in trainers:
                print(f"{row['where']:<36}{row['forwardBackwardSeconds']:>10.2f}{row['optimStepSeconds']:>9.3f}"
                      f"{row['adapterMaxDiff']:>17.2e}")
        import ray
        ray.shutdown()
    print(f"run folders: {args.out}")
    print(json.dumps({"kernels": kernels(), "environmentWorkers": envs, "offPolicy": steps,
                      "dataParallel": trainers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
