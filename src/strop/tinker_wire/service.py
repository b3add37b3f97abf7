"""What `strop serve-tinker` keeps and runs: sessions, training models, samplers, futures and one compute worker.

    service = TinkerService(home / "tinker")
    future_id = service.submit(session, "ForwardBackward", job)      # returns at once
    record = service.future(future_id, owner)                         # done / payload / error, awaited by the app

Every request that computes (create a model, forward_backward, optim_step, save, load, sample) becomes a job on
one worker thread and answers at once with a future id, as Tinker's service does; the SDK then long-polls
`retrieve_future`. The worker takes training jobs from the sessions in turn (round robin, each session's own in
the order they came), so one busy client does not starve another, and runs the sampling requests that are waiting
together, batched by the engine, between training jobs (how: `strop.tinker_wire.scheduling`). A session's jobs,
models, samplers, futures and checkpoints are tied to the API key that made it (its owner); another key is told they
do not exist.

Bounds: sessions, models, queued jobs per session, futures kept per owner, samples per request and tokens per
sequence all have limits (the constants below), so no client can hold the server's memory; a finished result
is dropped after it was read (or after an hour unread), a session without heartbeats for SESSION_IDLE_S is
closed and its models released.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from strop.errors import StropError
from strop.tinker_wire.checkpoints import CheckpointStore
from strop.tinker_wire.codec import WireError
# Continue (what a sampling job returns to have its next turn queued) is part of this module's interface
from strop.tinker_wire.records import Continue, FutureRecord, Model, Sampler, Session  # noqa: F401
from strop.tinker_wire.scheduling import Scheduler, whose

MAX_SESSIONS = 64
MAX_SESSIONS_PER_KEY = 16       # so that one API key cannot take every session
MAX_MODELS = 8                  # live LoRA training models on this server (each is trained in memory)
MAX_MODELS_PER_KEY = 4
MAX_SAMPLERS_PER_SESSION = 16   # sampling clients kept per session (each holds an adapter snapshot); older ones go
FINISHED_KEEP_S = 3600.0        # a finished session's record is dropped this long after it finished
MAX_FUTURES = 4096              # results kept per owner, read or not
RESULT_TTL_S = 3600.0           # an unread result is dropped after this long
READ_RESULT_TTL_S = 300.0       # a read one after this long (a retried read still finds it)
SESSION_IDLE_S = 600.0          # no heartbeat nor request for this long: the session is closed
MAX_SAMPLES = 128               # num_samples in one sampling request
QUEUED_BYTES_PER_KEY = 256 << 20   # request data (forward_backward bodies) one key may have waiting to run
RESULT_BYTES_PER_KEY = 512 << 20   # finished results one key's requests hold; past it the oldest are evicted
SAMPLE_BATCH_TOKENS = 8192         # sampled tokens (num_samples x max_tokens) one sampling batch takes (>= 1 request)
QUEUED_TOKENS_PER_KEY = 1 << 19    # sampled tokens one key may have waiting
FAILED_RESOLVE_S = 60.0         # a base model that could not be resolved is refused this long without a retry


def owner_of(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:24]


class TinkerService(Scheduler):
    def __init__(self, root: Path, *, dtype: str = "auto", max_batch: int = 64, register_checkpoint=None,
                 log=None, start_worker: bool = True, resolve_model=None,
                 queued_bytes_per_key: int = QUEUED_BYTES_PER_KEY,
                 result_bytes_per_key: int = RESULT_BYTES_PER_KEY,
                 queued_tokens_per_key: int = QUEUED_TOKENS_PER_KEY, sample_batch_tokens: int = SAMPLE_BATCH_TOKENS):
        """`start_worker=False`: the caller runs `work()` itself, on the thread that should do the computing
        (`strop serve-tinker` uses the main thread). Every torch computation of the server runs on the worker:
        a second thread that runs torch gets an OpenMP team of its own, and with more OpenMP threads than cores
        decoding was ~30% slower on a 2-core machine (measured; libgomp then waits at its barriers instead of
        spinning)."""
        import strop  # lazy: torch and the engine load when the server starts, not when the CLI parses
        self.strop = strop.ServiceClient(dtype=dtype, max_batch=max_batch)
        self.store = CheckpointStore(root)
        self.register_checkpoint = register_checkpoint   # (run id, run info, folder) -> (modelId, store runId)
        self.log = log            # a callable taking one line per job run (strop serve-tinker --log-jobs), or None
        self.lock = threading.Condition()
        self.engine_lock = threading.Lock()       # held while a sampler engine (a model in memory) is made
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.samplers: dict[str, Sampler] = {}
        self.futures: dict[str, FutureRecord] = {}
        self.released_samplers: dict[str, None] = {}      # ids of samplers dropped to keep a session's newest
        self.owner_futures: dict[str, deque] = {}
        self._init_queues(queued_bytes_per_key, queued_tokens_per_key, sample_batch_tokens)
        self.result_bytes_per_key = result_bytes_per_key
        self.result_bytes: dict[str, int] = {}     # owner -> bytes its kept results hold
        self._model_info: dict[str, dict] = {}
        # where base models come from (default strop.models.resolve_model, which may download for minutes): it
        # runs on these threads, never on the event loop; a failure is remembered for FAILED_RESOLVE_S
        self._resolve_model = resolve_model
        self._failed_models: dict[str, tuple[float, str]] = {}
        self._resolver = ThreadPoolExecutor(max_workers=2, thread_name_prefix="strop-tinker-resolve")
        self._stop = False
        if start_worker:
            threading.Thread(target=self.work, name="strop-tinker-worker", daemon=True).start()
        self.reaper = threading.Thread(target=self._reap, name="strop-tinker-reaper", daemon=True)
        self.reaper.start()

    # ---- sessions ------------------------------------------------------------------------------------
    def create_session(self, owner: str, tags: list, user_metadata: dict | None,
                       project_id: str | None = None, *, holder: str | None = None) -> Session:
        """`holder`: whose quota the session counts against (`tenants.Tenancy.quota_holder`; the owner's by
        default)."""
        holder = owner if holder is None else holder
        with self.lock:
            live = [s for s in self.sessions.values() if not s.finished]
            if len(live) >= MAX_SESSIONS:
                raise WireError(f"this server holds {MAX_SESSIONS} open sessions; close one (ServiceClient.close) "
                                "or wait for idle ones to expire", status=503)
            if sum(1 for s in live if s.holder == holder) >= MAX_SESSIONS_PER_KEY:
                raise WireError(f"{whose(owner, holder)} has {MAX_SESSIONS_PER_KEY} open sessions; close one "
                                "(ServiceClient.close) before opening another")
            session = Session(id="s" + secrets.token_hex(8), owner=owner, holder=holder,
                              tags=[str(t)[:100] for t in list(tags)[:32]],
                              user_metadata={str(k)[:100]: str(v)[:1000] for k, v in list(user_metadata.items())[:64]}
                              if isinstance(user_metadata, dict) else None, project_id=project_id)
            self.sessions[session.id] = session
            return session

    def session(self, session_id: str, owner: str, *, live: bool = True) -> Session:
        with self.lock:
            session = self.sessions.get(session_id) if isinstance(session_id, str) else None
            if session is None or session.owner != owner:
                raise WireError(f"no session {str(session_id)[:40]!r} for this API key", status=404)
            if live and session.finished:
                raise WireError(f"session {session_id} is finished ({session.finished}); start a new ServiceClient",
                                status=410)
            session.last_seen = time.time()
            return session

    def finish_session(self, session_id: str, owner: str, reason: str) -> None:
        session = self.session(session_id, owner, live=False)
        with self.lock:
            if session.finished is None:
                session.finished, session.finished_at = reason, time.time()
                self._release(session)

    def _release(self, session: Session) -> None:
        for model_id in list(session.models):
            self.models.pop(model_id, None)
        for sampler_id in list(session.samplers):
            self.samplers.pop(sampler_id, None)
        session.models.clear()
        session.samplers.clear()

    # ---- futures -------------------------------------------------------------------------------------
    def new_future(self, owner: str, kind: str) -> FutureRecord:
        record = FutureRecord(id=f"f{secrets.token_hex(12)}", owner=owner, kind=kind)
        with self.lock:
            if self._stop:
                raise WireError("the server is stopping; start it again and resend the request", status=503)
            kept = self.owner_futures.setdefault(owner, deque())
            while len(kept) >= MAX_FUTURES:
                old = self.futures.get(kept[0])
                if old is not None and not old.done:
                    raise WireError(f"{MAX_FUTURES} requests of this API key are unfinished; wait for some",
                                    status=429)
                self._forget(kept.popleft())
            kept.append(record.id)
            self.futures[record.id] = record
        return record

    def future(self, future_id: str, owner: str) -> FutureRecord:
        with self.lock:
            record = self.futures.get(future_id) if isinstance(future_id, str) else None
        if record is None or record.owner != owner:
            raise WireError(f"no request {str(future_id)[:48]!r} for this API key (unknown, another key's, or its "
                            "result was already dropped)", status=404)
        return record

    def _forget(self, future_id: str) -> None:
        record = self.futures.pop(future_id, None)
        if record is not None and record.size:
            self.result_bytes[record.owner] -= record.size

    def _evict_results(self, owner: str) -> None:
        """Past the owner's result budget, its oldest kept results lose their payload (a read of one says so)."""
        for future_id in self.owner_futures.get(owner, ()):
            if self.result_bytes.get(owner, 0) <= self.result_bytes_per_key:
                return
            old = self.futures.get(future_id)
            if old is None or not old.size:
                continue
            self.result_bytes[owner] -= old.size
            old.payload, old.size, old.category = None, 0, "user"
            old.error = (f"the result of {old.kind} {old.id} was evicted unread: this API key's kept results passed "
                         f"their {self.result_bytes_per_key >> 20} MiB budget (strop serve-tinker "
                         "--results-mib-per-key); read results as they finish, or resend the request")

    def add_waiter(self, record: FutureRecord, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future) -> None:
        with self.lock:
            if record.done:
                waiter.set_result(None)
            else:
                record.waiters.append((loop, waiter))

    def _complete(self, record: FutureRecord, payload=None, error: str | None = None, category: str = "user"):
        with self.lock:
            if record.done:
                return            # answered already (the server stopped while it ran): the first answer stands
            record.payload, record.error, record.category, record.done = payload, error, category, True
            if isinstance(payload, bytes):
                record.size = len(payload)
                self.result_bytes[record.owner] = self.result_bytes.get(record.owner, 0) + record.size
                self._evict_results(record.owner)
            waiters, record.waiters = record.waiters, []
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(lambda w=waiter: w.done() or w.set_result(None))
            except RuntimeError:      # the loop closed: its request is gone
                pass

    def _reap(self) -> None:
        rounds = 0
        while not self._stop:
            time.sleep(5.0)
            self.reap()
            rounds += 1
            if rounds % 12 == 0:        # each minute: the run folders of sessions long gone, without checkpoints
                self.reap_runs()

    def reap_runs(self) -> list[str]:
        """Remove run folders without checkpoints whose session this server no longer keeps (a finished session
        is kept FINISHED_KEEP_S, and until its queued jobs ran; so no save of it can still come)."""
        def in_use(run_id: str) -> bool:
            with self.lock:
                return run_id in self.models or run_id.split(":", 1)[0] in self.sessions
        return self.store.reap_runs(in_use)

    def reap(self, now: float | None = None) -> None:
        """Close sessions idle past SESSION_IDLE_S (their models and samplers freed) and drop old results."""
        now = time.time() if now is None else now
        with self.lock:
            for session in self.sessions.values():
                if session.finished is None and now - session.last_seen > SESSION_IDLE_S:
                    session.finished, session.finished_at = "expired", now
                    self._release(session)
            for sid in [sid for sid, s in self.sessions.items()
                        if s.finished_at is not None and now - s.finished_at > FINISHED_KEEP_S and not s.jobs]:
                del self.sessions[sid]
            for fid, record in list(self.futures.items()):
                if record.done and ((record.read_at and now - record.read_at > READ_RESULT_TTL_S)
                                    or now - record.created > RESULT_TTL_S):
                    self._forget(fid)

    def close(self, reason: str = "the server stopped before this request finished; start it again and resend "
                                   "the request") -> None:
        """Stop the worker and answer every unfinished request (queued or running) with `reason` at once: a
        stopping server waits for no job, and no client is left polling a result that will never come."""
        with self.lock:
            self._stop = True
            self.lock.notify_all()
            unfinished = [r for r in self.futures.values() if not r.done]
        for record in unfinished:
            self._complete(record, error=reason, category="server")

    def register(self, path: str, owner: str) -> str | None:
        """Make a saved checkpoint a tuned model in strop's store (`strop models list`, `strop serve`), when the
        server was given a way to (`register_checkpoint`). A store that cannot be written does not fail the save,
        which is on disk already: it is said on stderr."""
        if self.register_checkpoint is None:
            return None
        try:
            return self.store.register(path, owner, self.register_checkpoint)
        except Exception as exc:  # noqa: BLE001 - the checkpoint itself is saved; the store is the extra
            print(f"strop serve-tinker: {path} saved, but not registered in the store: {exc}", file=sys.stderr)
            return None

    # ---- models --------------------------------------------------------------------------------------
    async def resolve(self, base_model: str) -> dict:
        """`model_info`, with a model not resolved yet resolved on a resolver thread: a download blocks only the
        request that asked for it, not every tenant's."""
        if base_model in self._model_info:
            return self._model_info[base_model]
        return await asyncio.get_running_loop().run_in_executor(self._resolver, self.model_info, base_model)

    def model_info(self, base_model: str) -> dict:
        """The base model's folder, vocabulary size and context length; WireError for a model not on offer."""
        from strop.models import CATALOG, resolve_model   # lazy: part of the engine's import
        if base_model not in self._model_info:
            if base_model not in {entry.model_id for entry in CATALOG}:
                names = ", ".join(entry.model_id for entry in CATALOG)
                raise WireError(f"unknown base model {str(base_model)[:100]!r}; this server offers {names}")
            failed = self._failed_models.get(base_model)
            if failed and time.monotonic() - failed[0] < FAILED_RESOLVE_S:
                raise WireError(f"{failed[1]} (remembered: tried again {FAILED_RESOLVE_S:g} s after it failed)")
            try:
                folder = (self._resolve_model or resolve_model)(base_model)
            except StropError as exc:
                message = f"base model {base_model!r} is not available here: {exc}"
                self._failed_models[base_model] = (time.monotonic(), message)
                raise WireError(message) from None
            config = json.loads((Path(folder) / "config.json").read_text())
            self._model_info[base_model] = {
                "folder": str(folder), "vocab_size": int(config.get("vocab_size", 0)),
                "context": int(config.get("max_position_embeddings") or 32768),
                "arch": (config.get("architectures") or ["unknown"])[0]}
        return self._model_info[base_model]

    def model(self, model_id: str, owner: str) -> Model:
        with self.lock:
            model = self.models.get(model_id) if isinstance(model_id, str) else None
        if model is None or model.owner != owner:
            raise WireError(f"no training model {str(model_id)[:80]!r} for this API key (unknown, another key's, "
                            "or its session has ended)", status=404)
        session = self.session(model.session_id, owner)
        session.last_seen = model.last_request = time.time()
        return model

    def add_model(self, session: Session, seq: int, base_model: str, rank: int, lora: dict) -> Model:
        if not 0 <= seq < 10**9:
            raise WireError(f"model_seq_id must be 0..999999999, got {seq}")
        model_id = f"{session.id}:train:{seq}"
        with self.lock:
            if model_id in self.models:
                raise WireError(f"model {model_id} exists already (model_seq_id {seq} was used in this session)")
            if len(self.models) >= MAX_MODELS:
                raise WireError(f"this server trains at most {MAX_MODELS} models at once; finish a session "
                                "(ServiceClient.close) to free one")
            if sum(1 for m in self.models.values() if m.holder == session.holder) >= MAX_MODELS_PER_KEY:
                raise WireError(f"{whose(session.owner, session.holder)} trains {MAX_MODELS_PER_KEY} models "
                                "already; finish a session (ServiceClient.close) to free one")
            model = Model(id=model_id, session_id=session.id, owner=session.owner, base_model=base_model, rank=rank,
                          lora=lora, holder=session.holder)
            self.models[model_id] = model
            session.models.add(model_id)
        return model

    def add_sampler(self, session: Session, seq: int | None, base_model: str, model_path: str | None,
                    client, *, inflight_of: str | None = None) -> Sampler:
        if seq is not None and not 0 <= seq < 10**9:
            raise WireError(f"sampling_session_seq_id must be 0..999999999, got {seq}")
        sampler_id = f"{session.id}:sample:{seq if seq is not None else secrets.token_hex(4)}"
        sampler = Sampler(id=sampler_id, session_id=session.id, owner=session.owner, base_model=base_model,
                          model_path=model_path, client=client, inflight_of=inflight_of)
        with self.lock:
            self.samplers[sampler_id] = sampler
            session.samplers[sampler_id] = None
            while len(session.samplers) > MAX_SAMPLERS_PER_SESSION:     # each holds an adapter: keep the newest
                oldest = next(iter(session.samplers))
                del session.samplers[oldest]
                self.samplers.pop(oldest, None)
                self.released_samplers[oldest] = None
                while len(self.released_samplers) > 4096:
                    del self.released_samplers[next(iter(self.released_samplers))]
        return sampler

    def publish_inflight(self, model_id: str, client) -> None:
        """An inflight save of a training model: each of its inflight sampling clients samples `client`'s weights
        from now on (a request already running finishes on the weights it started with)."""
        with self.lock:
            for sampler in self.samplers.values():
                if sampler.inflight_of == model_id:
                    sampler.client = client

    def sampler(self, sampler_id: str, owner: str) -> Sampler:
        with self.lock:
            sampler = self.samplers.get(sampler_id) if isinstance(sampler_id, str) else None
        if sampler is None and sampler_id in self.released_samplers:
            raise WireError(f"sampler {sampler_id} was released: a session keeps its {MAX_SAMPLERS_PER_SESSION} "
                            "newest sampling clients (each holds a copy of the adapter); make a new one", status=404)
        if sampler is None or sampler.owner != owner:
            raise WireError(f"no sampler {str(sampler_id)[:80]!r} for this API key (unknown, another key's, or its "
                            "session has ended)", status=404)
        self.session(sampler.session_id, owner)
        return sampler
