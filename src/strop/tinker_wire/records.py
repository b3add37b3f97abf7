"""The records `strop serve-tinker`'s service keeps: futures, sessions, training models, samplers, and the jobs its
worker runs (with `Continue`, what a sampling job returns when its request has more to sample)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class FutureRecord:
    id: str
    owner: str
    kind: str
    created: float = field(default_factory=time.time)
    done: bool = False
    payload: Any = None           # bytes (protobuf) or a JSON-able dict
    error: str | None = None
    category: str = "user"
    read_at: float | None = None
    size: int = 0                  # bytes its payload holds, counted against its owner's result budget
    waiters: list = field(default_factory=list)


@dataclass
class Session:
    id: str
    owner: str
    holder: str = ""                                 # whose quota it counts against (tenants.Tenancy)
    created: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    finished: str | None = None
    user_metadata: dict | None = None
    tags: list = field(default_factory=list)
    jobs: deque = field(default_factory=deque)
    models: set = field(default_factory=set)
    samplers: dict = field(default_factory=dict)     # sampler id -> None, oldest first
    finished_at: float | None = None
    project_id: str | None = None                    # its training runs are listed under this project


@dataclass
class Model:
    id: str
    session_id: str
    owner: str
    base_model: str
    rank: int
    lora: dict
    holder: str = ""               # its session's quota holder
    client: Any = None             # strop TrainingClient, once created
    last_request: float = field(default_factory=time.time)
    seq_futures: dict = field(default_factory=dict)   # seq_id -> future id: a re-sent request is not run twice


@dataclass
class Sampler:
    id: str
    session_id: str
    owner: str
    base_model: str
    model_path: str | None
    client: Any                    # strop SamplingClient
    seq_futures: dict = field(default_factory=dict)
    inflight_of: str | None = None  # an inflight client of this training model: it samples the model's newest
                                    # inflight save (SamplingClientKind "inflight")


@dataclass
class Job:
    session_id: str
    future: FutureRecord
    run: Callable[[], Any]
    sample: dict | None = None     # a sampling job: {"sampler": Sampler, "prompt": [...], ...}
    holder: str = ""               # whose queued-bytes budget it counts against
    cost: int = 0                  # bytes of request data it holds until it has run
    tokens: int = 0                # tokens a sampling job may still sample (num_samples x max_tokens at first)
    turn_tokens: int | None = None  # tokens it samples this turn, its share of a sampling batch (None: `tokens`)


@dataclass
class Continue:
    """What a sampling job's finish returns when its request has more to sample: the request's next turn (a run as
    a sampling job's: it queues on the engine and returns its finish), queued behind the other keys' requests, so a
    long request is served a chunk at a time and another key waits for a chunk, not for the whole."""
    run: Callable[[], Any]
    tokens: int                    # tokens the request may still sample
    turn_tokens: int               # tokens the next turn samples at most
