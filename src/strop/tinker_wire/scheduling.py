"""How `strop serve-tinker`'s one worker thread picks and runs jobs (`Scheduler`, a part of `TinkerService`): the
sessions' training jobs in turn (round robin, each session's own in the order they came), and the sampling
requests that are waiting batched between them, the keys' requests taken in turn up to a batch's tokens; with the
per-key budgets a job is admitted against (queued request bytes, queued sampled tokens)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

from strop.errors import StropError
from strop.tinker_wire.codec import WireError
from strop.tinker_wire.records import Continue, Job, Session

MAX_QUEUED = 512                # jobs waiting per session
SAMPLE_GATHER_S = 0.02          # the worker batches sampling requests until none has arrived for this long,
SAMPLE_GATHER_MAX_S = 0.25      # or for at most this long


def whose(owner: str, holder: str) -> str:
    """Who a refusal says is over a quota: the key, or on an open server the client's address."""
    return "this API key" if holder == owner else "this client address (an open server's quotas are per address)"


class Scheduler:
    """The job queues of `TinkerService` and the worker that runs them. It uses the service's `lock`, `_stop`,
    `sessions`, `futures`, `log`, `new_future` and `_complete`; its own state is set by `_init_queues`."""

    def _init_queues(self, queued_bytes_per_key: int, queued_tokens_per_key: int, sample_batch_tokens: int) -> None:
        self.samples: deque[Job] = deque()
        self.sample_batches: deque[int] = deque(maxlen=1000)   # requests per sampling batch, for the curious
        self._order: deque[str] = deque()          # sessions with queued jobs, in turn order
        self.queued_bytes_per_key = queued_bytes_per_key
        self.queued_bytes: dict[str, int] = {}     # quota holder -> bytes of request data its queued jobs hold
        self.queued_tokens_per_key, self.sample_batch_tokens = queued_tokens_per_key, sample_batch_tokens
        self._sample_turns: dict[str, int] = {}    # holder -> the turn its sampling request was last taken
        self._turn = 0

    def submit(self, session: Session, kind: str, run: Callable[[], Any], *, sample: dict | None = None,
               cost: int = 0, tokens: int = 0, turn_tokens: int | None = None) -> str:
        """`cost`: the bytes of request data the job holds while it waits (counted against the session's quota
        holder until it has run). A sampling job's `tokens` are all it may sample, `turn_tokens` what its first turn
        samples (its finish returns `Continue` for the next)."""
        holder = session.holder or session.owner
        with self.lock:
            held = self.queued_bytes.get(holder, 0)
            if cost and held + cost > self.queued_bytes_per_key:
                raise WireError(f"{whose(session.owner, holder)} has {held >> 20} MiB of requests waiting and this "
                                f"one adds {cost >> 20} MiB, over its {self.queued_bytes_per_key >> 20} MiB budget "
                                "(strop serve-tinker --queued-mib-per-key); wait for results before sending more",
                                status=429)
            waiting = sum(j.tokens for j in self.samples if j.holder == holder)
            if tokens and waiting + tokens > self.queued_tokens_per_key:
                raise WireError(f"{whose(session.owner, holder)} has {waiting} sampled tokens waiting and this "
                                f"request adds {tokens}, over its {self.queued_tokens_per_key} "
                                "(strop serve-tinker --queued-tokens-per-key); wait for samples before sending more",
                                status=429)
        record = self.new_future(session.owner, kind)
        job = Job(session.id, record, run, sample, holder=holder, cost=cost, tokens=tokens, turn_tokens=turn_tokens)
        with self.lock:
            if len(session.jobs) + sum(1 for j in self.samples if j.session_id == session.id) >= MAX_QUEUED:
                self.futures.pop(record.id, None)
                raise WireError(f"session {session.id} has {MAX_QUEUED} requests waiting; wait for some results",
                                status=429)
            self.queued_bytes[holder] = self.queued_bytes.get(holder, 0) + cost
            if sample is not None:
                self.samples.append(job)
            else:
                if not session.jobs:
                    self._order.append(session.id)
                session.jobs.append(job)
            self.lock.notify_all()
        return record.id

    def _next_training_job(self) -> Job | None:
        while self._order:
            session = self.sessions.get(self._order.popleft())
            if session is None or not session.jobs:
                continue
            job = session.jobs.popleft()
            if session.jobs:
                self._order.append(session.id)
            return job
        return None

    def work(self) -> None:
        """Run jobs until `close()`: the sessions' training jobs in turn, waiting sampling requests batched
        between them."""
        prefer_samples = False
        while True:
            with self.lock:
                while not self._stop and not self.samples and not self._order:
                    self.lock.wait()
                if self._stop:
                    return
                job = None
                if not (prefer_samples and self.samples):
                    job = self._next_training_job()
                take_samples = job is None
            prefer_samples = not prefer_samples
            if take_samples:
                self._run_samples()
            else:
                self._run(job)

    def _run(self, job: Job) -> None:
        started = time.perf_counter()
        try:
            result = job.run()
        except WireError as exc:
            self._complete(job.future, error=str(exc), category="user")
        except StropError as exc:
            self._complete(job.future, error=str(exc), category="user")
        except MemoryError:
            self._complete(job.future, error="the server ran out of memory for this request; send a smaller batch",
                           category="server")
        except Exception as exc:  # a bug, reported to the one client whose request met it; the server goes on
            self._complete(job.future, error=f"{type(exc).__name__}: {exc}", category="server")
        else:
            if isinstance(result, Continue):
                self._requeue(job, result)
            else:
                self._complete(job.future, payload=result)
        if job.cost:
            with self.lock:
                self.queued_bytes[job.holder] -= job.cost
                if self.queued_bytes[job.holder] <= 0:
                    del self.queued_bytes[job.holder]
        if self.log is not None:
            self.log(f"{job.future.kind} {job.session_id} {time.perf_counter() - started:.2f} s"
                     + (f" error: {job.future.error[:200]}" if job.future.error else ""))

    def _run_samples(self) -> None:
        # requests sent together arrive a few ms apart: wait until none has come for SAMPLE_GATHER_S (at most
        # SAMPLE_GATHER_MAX_S), then run them all in one batch
        deadline = time.monotonic() + SAMPLE_GATHER_MAX_S
        seen = -1
        while time.monotonic() < deadline:
            with self.lock:
                count = len(self.samples)
            if count == seen:
                break
            seen = count
            time.sleep(SAMPLE_GATHER_S)
        with self.lock:
            jobs = self._take_samples()
        self.sample_batches.append(len(jobs))
        if self.log is not None:
            self.log(f"sampling batch of {len(jobs)} request(s)")
        pending = []
        for job in jobs:
            try:
                pending.append((job, job.run()))     # queues on the engine; nothing runs yet
            except Exception as exc:
                self._complete(job.future, error=str(exc), category="user")
        for job, finish in pending:                  # the first result runs every queued request, batched
            self._run(Job(job.session_id, job.future, finish, job.sample, holder=job.holder))

    def _requeue(self, job: Job, more: Continue) -> None:
        """A sampling request's next turn, behind every request waiting now (unless it was answered meanwhile: the
        server stopped)."""
        with self.lock:
            if self._stop or job.future.done:
                return
            self.samples.append(Job(job.session_id, job.future, more.run, job.sample, holder=job.holder,
                                    tokens=more.tokens, turn_tokens=more.turn_tokens))
            self.lock.notify_all()

    def _take_samples(self) -> list[Job]:
        """The next sampling batch: the keys' waiting requests in turn (round robin, each key's own in order) up to
        sample_batch_tokens (at least one request), so a key's queue is run a batch at a time and another key's
        request waits for one batch, not for the whole queue."""
        by_key: dict[str, deque] = {}
        # the least recently served key first; sorted() is stable, so each key's requests stay in order
        for job in sorted(self.samples, key=lambda j: self._sample_turns.get(j.holder, 0)):
            by_key.setdefault(job.holder, deque()).append(job)
        taken, tokens = [], 0
        while by_key:
            for holder in list(by_key):
                job = by_key[holder][0]
                share = job.tokens if job.turn_tokens is None else job.turn_tokens
                if taken and tokens + share > self.sample_batch_tokens:
                    by_key.clear()
                    break
                taken.append(by_key[holder].popleft())
                tokens += share
                self._turn += 1
                self._sample_turns[holder] = self._turn
                if not by_key[holder]:
                    del by_key[holder]
        chosen = set(map(id, taken))
        self.samples = deque(j for j in self.samples if id(j) not in chosen)
        return taken
