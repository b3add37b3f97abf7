"""Sampler replicas on Ray: `RaySamplerEngine` has the sampler engine's interface (activate, generate,
prompt_logprobs), so every SamplingClient, and with it GRPO's rollouts, the KL to the base model and evaluations,
runs on the replicas unchanged.

    engine = RaySamplerEngine("strop/tiny-random", model_dir, settings=RaySettings(samplers=2), sampler="strop")
    engine.activate(adapter)            # sent once through Ray's object store, fetched by each replica on first use
    responses = engine.generate(requests)

Each replica is an actor holding one engine (strop's decoder or vLLM, `strop.engine.engine_choice`). A batch of
requests is cut into contiguous shares of about equal rows, one per replica, and the answers put back in order;
a seeded request draws sample i with its own seed (`strop.engine.sampler.row_seed`), so the tokens do not depend
on which replica drew them. A replica that dies mid-batch (its process killed, its node lost) has its share run
again on another replica while Ray restarts it; only when every try fails does the step fail, before its update,
so the run resumes from its last checkpoint.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from strop.cluster.connect import (ClusterError, actor_env, cluster_facts, connect, first_line, in_group, place,
                                   raised_there, stop_actors)
from strop.cluster.settings import RaySettings

START_TIMEOUT_S = 900.0   # loading the model on a replica (vLLM's start included)
RESTARTS = 3              # Ray restarts a dead replica this often; its share runs elsewhere meanwhile


class SamplerReplica:
    """One engine in one Ray actor (made by `RaySamplerEngine`; the class is wrapped by ray.remote there)."""

    def __init__(self, base_model: str, model_dir: str, sampler: str, dtype: str, max_batch: int, options: dict,
                 rollouts: bool = False):
        # lazy: the actor's process imports the engine, the driver need not
        from strop.engine.precision import sampler_dtype_for, torch_dtype, train_device
        from strop.engine.engine_choice import make_engine, resolve_sampler
        from strop.models import load_tokenizer, resolve_model

        # another node may not have the driver's folder: it finds the model by its id (its cache, or the hub)
        path = model_dir if Path(model_dir).is_dir() else str(resolve_model(base_model))
        self.sampler = resolve_sampler(sampler)
        device = train_device()  # the GPU Ray gave this actor, where it has one
        self.engine = make_engine(self.sampler, path, tokenizer=load_tokenizer(path),
                                  dtype=torch_dtype(sampler_dtype_for(dtype, device, rollouts)), max_batch=max_batch,
                                  device=device, **(options if self.sampler == "vllm" else {}))
        self.key = None

    def where(self) -> dict:
        import ray  # the actor's process has Ray (this class runs only there)
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()[:12], "sampler": self.sampler,
                **self.engine.facts}

    def _activate(self, adapter_box: list, key) -> None:
        if key != self.key:
            import ray  # the actor's process has Ray (this class runs only there)
            adapter = adapter_box[0]
            self.engine.activate(ray.get(adapter) if adapter is not None else None)
            self.key = key

    def generate(self, adapter_box: list, key, requests: list) -> list:
        self._activate(adapter_box, key)
        return self.engine.generate(requests)

    def prompt_logprobs(self, adapter_box: list, key, sequences: list) -> list:
        self._activate(adapter_box, key)
        return self.engine.prompt_logprobs(sequences)

    def prompt_topk(self, adapter_box: list, key, items: list) -> list:
        self._activate(adapter_box, key)
        return self.engine.prompt_topk([sequence for sequence, _ in items], items[0][1])

    def close(self) -> None:
        self.engine.close()


def shares(weights: list[int], parts: int) -> list[slice]:
    """Contiguous slices of `weights`' indices, at most `parts`, each of about equal total weight (none empty)."""
    total, out, start, acc = sum(weights), [], 0, 0
    parts = max(1, min(parts, len(weights)))
    for i, w in enumerate(weights):
        acc += w
        boundary = total * (len(out) + 1) / parts
        left = len(weights) - i - 1
        if len(out) < parts - 1 and (acc >= boundary or left == parts - 1 - len(out)):
            out.append(slice(start, i + 1))
            start = i + 1
    if start < len(weights):
        out.append(slice(start, len(weights)))
    return out


class RaySamplerEngine:
    """`settings.samplers` replicas of one engine on the cluster at `settings.address`."""

    continues_grammar = False  # a replica may be vLLM's: a json_schema sample runs whole
    continues_samples = False  # a replica draws in its own process

    def __init__(self, base_model: str, model_dir: str | Path, *, settings: RaySettings, sampler: str = "auto",
                 dtype: str = "auto", max_batch: int = 64, options: dict | None = None, reserved_gpus: int = 0,
                 run_gpus: int | None = None, rollouts: bool = False):
        self.ray = connect(settings.address)
        # a GPU each where the cluster has one for every replica beside those the trainers took; none where the
        # run's execution.gpus (`run_gpus`) is 0
        have = self.ray.cluster_resources().get("GPU", 0) if run_gpus != 0 else 0
        gpus = 1 if have and have - reserved_gpus >= settings.samplers else 0
        cpus = 0 if gpus else 1
        self.group = place(f"{settings.samplers} sampler replicas",
                           [{"GPU": 1} if gpus else {"CPU": 1}] * settings.samplers)
        options = {k: v for k, v in (options or {}).items() if k != "log_dir"}  # a vLLM replica logs on its node
        actor, common = self.ray.remote(SamplerReplica), {
            "num_cpus": cpus, "num_gpus": gpus, "max_restarts": RESTARTS, "max_task_retries": 0,
            "runtime_env": {"env_vars": actor_env(run_gpus)}}
        self.replicas = [actor.options(**common, **in_group(self.group, i)).remote(base_model, str(model_dir), sampler,
                                                                                  dtype, max_batch, options,
                                                                                  rollouts)
                         for i in range(settings.samplers)]
        self._adapter, self._box, self._key = None, [None], 0
        self.retries = 0
        self.closed = False
        try:
            placed = self._get([r.where.remote() for r in self.replicas], START_TIMEOUT_S, "start")
        except BaseException:
            self.close()
            raise
        self.facts = {"samplerReplicas": placed, "rayCluster": cluster_facts()}

    @property
    def alive(self) -> bool:
        return not self.closed

    def activate(self, adapter) -> None:
        if adapter is self._adapter:
            return
        # one copy in the object store; each replica fetches it on its first request under this key
        self._adapter, self._key = adapter, self._key + 1
        self._box = [self.ray.put(adapter) if adapter is not None else None]

    def generate(self, requests: list) -> list:
        return self._spread("generate", requests, [r.num_samples for r in requests])

    def prompt_logprobs(self, sequences: list[list[int]], max_batch_tokens: int = 8192) -> list:
        return self._spread("prompt_logprobs", sequences, [len(s) for s in sequences])

    def prompt_topk(self, sequences: list[list[int]], k: int) -> list:
        return self._spread("prompt_topk", [(s, k) for s in sequences], [len(s) for s in sequences])

    def _spread(self, method: str, items: list, weights: list[int]) -> list:
        if not items:
            return []
        parts = shares(weights, len(self.replicas))
        calls = {i: (part, self._call(i, method, items[part])) for i, part in enumerate(parts)}
        results: dict[int, list] = {}
        tries = {i: 0 for i in calls}
        while calls:
            i, (part, ref) = next(iter(calls.items()))
            try:
                results[i] = self._get(ref, None, method)
                del calls[i]
            except ReplicaDied as died:
                tries[i] += 1
                if tries[i] > len(self.replicas) + RESTARTS:
                    raise ClusterError(f"sampler replicas kept dying ({died}); the step stopped before its update: "
                                       "run the same command again to resume from the last checkpoint") from None
                self.retries += 1
                other = (i + tries[i]) % len(self.replicas)  # another replica (or this one once Ray restarted it)
                print(f"strop: a sampler replica died ({died}); its {part.stop - part.start} requests run again on "
                      f"replica {other}", file=sys.stderr)
                calls[i] = (part, self._call(other, method, items[part]))
        return [out for i in sorted(results) for out in results[i]]

    def _call(self, replica: int, method: str, items: list):
        return getattr(self.replicas[replica], method).remote(self._box, self._key, items)

    def _get(self, refs, timeout: float | None, what: str):
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(refs, timeout=timeout)
        except exceptions.GetTimeoutError:
            raise ClusterError(f"sampler replicas did not {what} within {timeout:g} s; `ray status` shows whether the "
                               "cluster has room for them") from None
        except exceptions.RayTaskError as exc:  # the engine itself refused or failed: its own error, as in-process
            raise raised_there(exc) or ClusterError(f"a sampler replica failed: {exc}") from None
        except (exceptions.RayActorError, exceptions.ActorUnavailableError) as exc:
            if what == "start":
                raise ClusterError(f"a sampler replica could not start: {first_line(exc)}") from None
            raise ReplicaDied(first_line(exc)) from None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        stop_actors(self.ray, self.replicas, self.group)


class ReplicaDied(Exception):
    pass
