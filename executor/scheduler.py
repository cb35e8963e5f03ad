"""The central scheduler process: the same `sangam.router.Router` as the simulator, driven by live events.

    python -m executor.scheduler --workers N [--mask-len 1024] [--port 50051] ...

All state changes happen on one core thread that drains an event queue: arrivals (Submit), worker
iteration reports, lost workers. gRPC handler threads validate, post events and read published
snapshots; they never touch the router or a `Request`. `Dispatch` actions become `Enqueue` calls made by
one sender thread per worker, so the core thread never waits on the network.

The scheduler keeps each request's token ids (prompt and committed blocks) because every block starts
with a prefill over the whole sequence, and that prefill may land on any worker (KV is freed at every
block end). Worker reports bring the 32 ids of each finished block, never whole sequences.

Disaggregated and hybrid layouts (`--mode <n>P<m>D|C`). The router answers a prefill worker's hand-off
with a `Transfer` once it has reserved the destination's pages in its tally. The core thread then orders
the attempt: RECEIVE to the destination (the block's work, its 32 ids after the prefill, the pages to
allocate) and SEND to the source, both with the attempt's tag and the pair's link generation. The
destination decodes as soon as its KV is in place and says so (a RECEIVE event, which precedes every
report of that decode); that success sends RELEASE to the source, whose RELEASE event frees its pages in
the router's tally (`Router.on_transfer_done`), as the simulator does at the transfer's end. An attempt
that failed at the destination is decided once both ends have reported: the pair's generation goes up
(both ends rebuild their process group) and the attempt is repeated, up to `--transfer-attempts`; then
the request ends with ERROR and a one-line reason, the destination has freed its pages, the source is
told to release its own, and both tallies are restored. A block's transfer runs from the moment the
destination's link thread takes it (after the transfers before it on that pair) to the KV's arrival in
its pages, retries included: the interval the simulator's link model charges (a transfer there starts
when its link is free). The time from the router's decision to that start, orders in flight and a busy
link, counts as decode queueing in both.

Two servers: the client port (`Scheduler` service and grpc.health.v1, SERVING once every worker has
registered) and the control port (`Control`: registration and reports), so that parked client streams
cannot starve worker traffic. A watchdog checks every worker's health each second; a worker that fails
twice in a row, or an `Enqueue` that fails, marks the cluster failed: every unfinished request gets
status ERROR with the reason and further submits are refused (re-routing a lost worker's requests needs
a router event that does not exist yet).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import logging
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc

from executor import rpc
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc
from sangam.batcher import Outcome
from sangam.config import RunConfig
from sangam.hardware import BLOCK, pages_for
from sangam.layout import Role, parse_mode
from sangam.request import BlockRecord, Request
from sangam.results import ITERATION_COLUMNS
from sangam.router import Action, Router, Transfer

ITERATION_LOG_COLUMNS = (*ITERATION_COLUMNS, "gpu_s", "items", "cycle_s")
ENQUEUE_ATTEMPTS = 3
TRANSFER_ATTEMPTS = 3  # per KV transfer, before its request fails
HEALTH_INTERVAL_S = 1.0
HEALTH_FAILURES = 2  # consecutive failed checks that declare a worker lost
CLIENT_THREADS = 256  # a parked Stream holds one
CLIENT_MAX_RPCS = 240  # beyond this, calls fail fast with RESOURCE_EXHAUSTED instead of queueing
TERMINAL = (pb.DONE, pb.ERROR)

log = logging.getLogger("sangam.scheduler")


@dataclass(slots=True, eq=False)
class Tracked:
    """One submitted request as the scheduler sees it; `state` is the snapshot clients read."""

    id: int
    arrival: float
    prompt: list[int]
    n_blocks: int
    planned: tuple[int, ...] | None  # forced forwards per block
    sampling: pb.SamplingParams
    req: Request | None = None  # None for a request rejected at Submit
    handoff_tokens: list[int] = field(default_factory=list)  # the handed-off block's ids after its prefill
    generated: list[int] = field(default_factory=list)
    status: pb.RequestStatus = pb.QUEUED
    error: str = ""
    eos: bool = False
    state: pb.RequestState = field(default_factory=pb.RequestState)
    changed: threading.Event = field(default_factory=threading.Event)  # set (and replaced) on publish


@dataclass(slots=True, eq=False)
class WorkerInfo:
    id: int
    address: str
    pages: int
    vocab: int
    mask_id: int
    eos_ids: tuple[int, ...]
    model: str
    device: str
    pid: int
    channel: grpc.Channel
    stub: pb_grpc.WorkerStub
    role: str = Role.COLOCATED.value
    free_pages: int | None = None  # as last reported
    outbox: queue.SimpleQueue[pb.BlockWork | pb.TransferOrder | None] = field(
        default_factory=queue.SimpleQueue
    )


@dataclass(slots=True, eq=False)
class Moving:
    """One KV transfer the router ordered, across its attempts (core thread only)."""

    id: int
    tracked: Tracked
    req: Request
    block: int
    src: int
    dst: int
    decided: float  # the router's decision
    block_tokens: list[int]
    link_start: float | None = None  # the destination's link thread took its first attempt
    attempt: int = 0
    generation: int = 0
    sent: pb.TransferEvent | None = None  # the current attempt's ends, once reported
    received: pb.TransferEvent | None = None
    done: bool = False  # the KV arrived, or the transfer was given up: only the source's release is left


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What Submit validates against, from the workers' registrations."""

    vocab: int
    mask_id: int
    eos_ids: tuple[int, ...]
    pages: int  # the smallest worker pool
    model: str


def record_of(req: Request) -> pb.RequestRecord:
    """The timing record of a finished request (sangam.results rebuilds its rows from it)."""
    record = pb.RequestRecord(
        request_id=req.id,
        arrival=req.arrival,
        prompt_len=req.prompt_len,
        output_len=req.output_len,
        mask_len=req.mask_len,
        forwards=list(req.steps),
    )
    for rec in req.blocks:
        times = record.blocks.add(ready=rec.ready, overflow=rec.overflow)
        for name in (
            "dispatch", "prefill_worker", "prefill_start", "prefill_end", "transfer_start", "transfer_end",
            "decode_worker", "decode_start", "end",
        ):  # fmt: skip
            value = getattr(rec, name)
            if value is not None:
                setattr(times, name, value)
    return record


def request_from_record(record: pb.RequestRecord, *, shift: float = 0.0) -> Request:
    """A finished `Request` rebuilt from its record, every time moved by `-shift`."""
    blocks = []
    for times in record.blocks:
        rec = BlockRecord(ready=times.ready - shift, overflow=times.overflow)
        for name in ("prefill_worker", "decode_worker"):
            if times.HasField(name):
                setattr(rec, name, getattr(times, name))
        for name in (
            "dispatch",
            "prefill_start",
            "prefill_end",
            "transfer_start",
            "transfer_end",
            "decode_start",
            "end",
        ):
            if times.HasField(name):
                setattr(rec, name, getattr(times, name) - shift)
        blocks.append(rec)
    req = Request(
        record.request_id,
        record.arrival - shift,
        record.prompt_len,
        record.output_len,
        record.mask_len,
        tuple(record.forwards),
        blocks=blocks,
    )
    req.block = len(blocks)
    return req


def block_work(tracked: Tracked, req: Request, block: int) -> pb.BlockWork:
    """What a worker needs to run `block` of `req`: the whole sequence's ids so far, and its schedule."""
    return pb.BlockWork(
        request_id=req.id,
        arrival=req.arrival,
        block=block,
        prompt_len=req.prompt_len,
        mask_len=req.mask_len,
        tokens=tracked.prompt + tracked.generated,
        forwards=tracked.planned[block] if tracked.planned else 0,
        sampling=tracked.sampling,
    )


class SchedulerCore:
    """Central state, the router, and the single thread that changes them."""

    def __init__(
        self,
        workers: int,
        *,
        mask_len: int,
        theta: int = 8192,
        seed: int = 0,
        stop_at_eos: bool = False,
        iteration_log: Path | None = None,
        mode: str = "colocated",
        transfer_attempts: int = TRANSFER_ATTEMPTS,
    ) -> None:
        layout = parse_mode(mode, workers)
        if layout.num_workers != workers:
            raise ValueError(f"mode {mode!r} names {layout.num_workers} workers, not {workers}")
        if transfer_attempts < 1:
            raise ValueError(f"transfer attempts must be at least 1, got {transfer_attempts}")
        if mask_len <= 0 or mask_len % BLOCK:
            raise ValueError(f"mask length must be a positive multiple of {BLOCK}, got {mask_len}")
        self.layout = layout
        self.n_workers = layout.num_workers
        self.mask_len = mask_len
        self.theta = theta
        self.seed = seed
        self.stop_at_eos = stop_at_eos
        self.transfer_attempts = transfer_attempts
        self.router: Router | None = None  # built once every worker has registered (pages known)
        self.facts: ModelFacts | None = None
        self.workers: dict[int, WorkerInfo] = {}
        self.failure = ""
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.on_ready: Callable[[], None] = lambda: None
        self.on_failure: Callable[[], None] = lambda: None
        self.tracked: dict[int, Tracked] = {}
        self.records: list[pb.RequestRecord] = []
        self.first_arrival: float | None = None
        self.submitted = self.done = self.errors = self.iterations = 0
        self._active: dict[int, Tracked] = {}  # core thread only
        self._moving: dict[int, Moving] = {}  # KV transfers not yet released by their source (core thread)
        self._transfer_ids = itertools.count()
        self._tags = itertools.count(1)  # one per attempt; 0 is the links' warm-up
        self._generations: dict[tuple[int, int], int] = {}  # (src, dst) -> the pair's link generation
        self.transfers_done = self.transfers_failed = self.transfer_retries = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()  # ids, arrivals and registrations
        self._events: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._log_file: TextIO | None = None
        self._log: Any = None
        if iteration_log is not None:
            iteration_log.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = iteration_log.open("w", newline="")
            self._log = csv.writer(self._log_file)
            self._log.writerow(ITERATION_LOG_COLUMNS)
        self._threads: list[threading.Thread] = []
        self._core = self._thread(self._core_loop, "core")

    # ---- lifecycle -------------------------------------------------------------------------------------

    def _thread(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def stop(self) -> None:
        """Stop the workers (best effort), the threads, and close the iteration log."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        with self._lock:
            workers = list(self.workers.values())
        for info in workers:
            info.outbox.put(None)
            with suppress(grpc.RpcError):
                info.stub.Shutdown(pb.ShutdownRequest(), timeout=2.0)
        self._events.put(None)
        for tracked in list(self.tracked.values()):  # wake every parked stream
            tracked.changed.set()
        rpc.join_all(self._threads, timeout=3.0)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        self._events.put((fn, args))

    def _core_loop(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            fn, args = event
            try:
                fn(*args)
            except Exception as err:  # a bug: fail loudly, never swallow
                log.exception("core event %s failed", getattr(fn, "__name__", fn))
                self._fail(f"internal error in the scheduler: {type(err).__name__}: {err}")

    # ---- registration ----------------------------------------------------------------------------------

    def register(self, msg: pb.RegisterRequest) -> pb.RegisterReply:
        with self._lock:
            if self.failure:
                return pb.RegisterReply(accepted=False, error=f"the cluster has failed: {self.failure}")
            if not 0 <= msg.worker_id < self.n_workers:
                return pb.RegisterReply(
                    accepted=False, error=f"worker id {msg.worker_id} outside 0..{self.n_workers - 1}"
                )
            role = self.layout.roles[msg.worker_id].value
            if (msg.role or Role.COLOCATED.value) != role:
                return pb.RegisterReply(
                    accepted=False,
                    error=f"worker {msg.worker_id} has the {msg.role or 'colocated'} role, "
                    f"{self.layout.name} gives it the {role} role",
                )
            old = self.workers.get(msg.worker_id)
            if old is not None:
                if old.address == msg.address and old.pid == msg.pid:
                    return pb.RegisterReply(accepted=True)
                return pb.RegisterReply(accepted=False, error=f"worker {msg.worker_id} is already registered")
            for other in self.workers.values():
                if (other.vocab, other.mask_id, other.eos_ids) != (
                    msg.vocab,
                    msg.mask_id,
                    tuple(msg.eos_ids),
                ):
                    return pb.RegisterReply(
                        accepted=False,
                        error=f"worker {msg.worker_id} serves a different model than worker {other.id}",
                    )
            channel = rpc.channel(msg.address)
            info = WorkerInfo(
                msg.worker_id, msg.address, msg.pages, msg.vocab, msg.mask_id, tuple(msg.eos_ids),
                msg.model, msg.device, msg.pid, channel, pb_grpc.WorkerStub(channel), role,
            )  # fmt: skip
            self.workers[msg.worker_id] = info
            self._thread(self._send_loop, f"enqueue-{info.id}", info)
            complete = len(self.workers) == self.n_workers
            if complete:
                pages = min(w.pages for w in self.workers.values())
                self.facts = ModelFacts(msg.vocab, msg.mask_id, tuple(msg.eos_ids), pages, msg.model)
                rng = RunConfig(gpus=self.n_workers, theta=self.theta, seed=self.seed).rng("router")
                self.router = Router(self.layout, pages, rng, self.theta)
        log.info("worker %d registered at %s (%s)", msg.worker_id, msg.address, msg.device)
        if complete:
            self._thread(self._watchdog, "watchdog")
            self.ready.set()
            self.on_ready()
        return pb.RegisterReply(accepted=True)

    # ---- submit, poll, stream --------------------------------------------------------------------------

    def validate(self, msg: pb.SubmitRequest) -> str | None:
        """Why a submitted request cannot run, as one line, or None."""
        facts = self.facts
        assert facts is not None
        prompt, gen_len, mask_len = msg.prompt_token_ids, msg.gen_len, self.mask_len
        if not prompt:
            return "empty prompt"
        if gen_len <= 0 or gen_len % BLOCK:
            return f"gen length {gen_len} is not a positive multiple of {BLOCK}"
        if gen_len > mask_len:
            return f"gen length {gen_len} exceeds the mask buffer of {mask_len} tokens"
        pages = pages_for(len(prompt) + mask_len)
        if pages > facts.pages:
            return (
                f"prompt too long for the KV pool: {len(prompt)} prompt tokens plus a {mask_len}-token mask "
                f"buffer need {pages} KV pages, a worker holds {facts.pages}"
            )
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= facts.vocab:
            position, token = next((i, t) for i, t in enumerate(prompt) if not 0 <= t < facts.vocab)
            return f"prompt token {token} at position {position} is outside the vocabulary [0, {facts.vocab})"
        if facts.mask_id in prompt:
            return (
                f"prompt token at position {list(prompt).index(facts.mask_id)} is the mask id {facts.mask_id}"
            )
        n_blocks = gen_len // BLOCK
        if msg.forwards:
            if len(msg.forwards) != n_blocks:
                return f"{len(msg.forwards)} planned forwards for {n_blocks} blocks"
            if any(not 1 <= d <= BLOCK for d in msg.forwards):
                return f"planned forwards must lie in [1, {BLOCK}], got {list(msg.forwards)}"
        sampling = msg.sampling
        if sampling.HasField("threshold") and not 0.0 < sampling.threshold <= 1.0:
            return f"threshold must lie in (0, 1], got {sampling.threshold}"
        if sampling.HasField("temperature") and not 0.0 <= sampling.temperature < math.inf:
            return f"temperature must be a finite number >= 0, got {sampling.temperature}"
        return None

    def unavailable(self) -> str | None:
        if self.failure:
            return f"the cluster has failed: {self.failure}"
        if self.stopped.is_set():
            return "the scheduler is shutting down"
        if not self.ready.is_set():
            return f"waiting for workers: {len(self.workers)} of {self.n_workers} registered"
        return None

    def submit(self, msg: pb.SubmitRequest) -> pb.SubmitReply:
        """Accept one request (or record why not); the caller checked `unavailable()` first."""
        reason = self.validate(msg)
        n_blocks = msg.gen_len // BLOCK if reason is None else 0
        planned = tuple(msg.forwards) if msg.forwards else None
        with self._lock:
            rid, arrival = next(self._ids), time.monotonic()
            if self.first_arrival is None and reason is None:
                self.first_arrival = arrival
            prompt = list(msg.prompt_token_ids) if reason is None else []
            tracked = Tracked(rid, arrival, prompt, n_blocks, planned, msg.sampling)
            self.tracked[rid] = tracked
            self.submitted += 1
            if reason is not None:
                tracked.status, tracked.error = pb.ERROR, reason
                self.errors += 1
            else:
                steps = planned or (BLOCK,) * n_blocks
                tracked.req = Request(rid, arrival, len(tracked.prompt), msg.gen_len, self.mask_len, steps)
            self._publish(tracked)
            if tracked.req is not None:
                self._post(self._on_arrival, tracked)
        return pb.SubmitReply(request_id=rid, status=tracked.status, error=tracked.error)

    def poll(self, rid: int) -> pb.RequestState:
        tracked = self.tracked.get(rid)
        if tracked is None:
            return pb.RequestState(request_id=rid, status=pb.NOT_FOUND, error=f"no request {rid}")
        return tracked.state

    def stream(self, rid: int, active: Callable[[], bool]) -> Iterator[pb.RequestState]:
        tracked = self.tracked.get(rid)
        if tracked is None:
            yield self.poll(rid)
            return
        last: pb.RequestState | None = None
        while True:
            changed = tracked.changed  # read before the state: a publish in between sets this event
            state = tracked.state
            if state is not last:
                yield state
                last = state
            if state.status in TERMINAL or self.stopped.is_set() or not active():
                return
            changed.wait(1.0)

    def status(self) -> pb.StatusReply:
        facts = self.facts
        reply = pb.StatusReply(
            ready=self.ready.is_set() and not self.failure,
            workers_expected=self.n_workers,
            workers_registered=len(self.workers),
            submitted=self.submitted,
            done=self.done,
            errors=self.errors,
            iterations=self.iterations,
            failure=self.failure,
            mask_len=self.mask_len,
            layout=self.layout.name,
            transfers_done=self.transfers_done,
            transfers_failed=self.transfers_failed,
            transfer_retries=self.transfer_retries,
            transfers_in_flight=len(self._moving),
            first_arrival=self.first_arrival or 0.0,
        )
        router = self.router
        for wid in sorted(self.workers):
            info = self.workers[wid]
            state = reply.workers.add(
                worker_id=wid,
                role=info.role,
                pages=info.pages,
                free_pages=info.pages if info.free_pages is None else info.free_pages,
            )
            if router is not None:
                state.router_free, state.outstanding = router.free[wid], router.outstanding[wid]
        if facts is not None:
            reply.vocab, reply.mask_id, reply.pages, reply.model = (
                facts.vocab,
                facts.mask_id,
                facts.pages,
                facts.model,
            )
            reply.eos_ids.extend(facts.eos_ids)
        return reply

    def results(self) -> pb.ResultsReply:
        return pb.ResultsReply(requests=list(self.records))

    def _publish(self, t: Tracked) -> None:
        """Replace the request's client-visible snapshot (never mutated once published)."""
        req = t.req
        end = req.blocks[-1].end if req is not None and req.finished else None
        state = pb.RequestState(
            request_id=t.id,
            status=t.status,
            error=t.error,
            token_ids=t.generated,
            blocks_done=req.block if req is not None else 0,
            n_blocks=req.n_blocks if req is not None else t.n_blocks,
            eos=t.eos,
            arrival=t.arrival,
            end=end or 0.0,
            forwards=list(req.steps[: req.block]) if req is not None else [],
        )
        t.state = state  # before the swap: a stream that sees the new event sees this state
        changed, t.changed = t.changed, threading.Event()
        changed.set()  # wakes only this request's streams

    # ---- core thread -----------------------------------------------------------------------------------

    def _on_arrival(self, tracked: Tracked) -> None:
        if self.failure:
            self._error(tracked, self.failure)
            return
        assert self.router is not None and tracked.req is not None
        self._active[tracked.id] = tracked
        self._apply(self.router.on_arrival(time.monotonic(), tracked.req))

    def _on_batch(self, batch: pb.ReportBatch) -> None:
        """One worker's report batch: its transfer events first, then its iterations."""
        info = self.workers.get(batch.worker_id)
        if info is not None and batch.HasField("free_pages"):
            info.free_pages = batch.free_pages
        if not self.failure:
            for event in batch.transfers:
                self._on_transfer_event(batch.worker_id, event)
        self._on_reports(batch.worker_id, list(batch.iterations))

    def _on_reports(self, worker: int, reports: Sequence[pb.IterationReport]) -> None:
        self.iterations += len(reports)
        if self._log is not None and self._log_file is not None:
            for report in reports:
                self._log_row(report)
            self._log_file.flush()  # before any request of these reports can be seen DONE
        if self.failure:
            return
        for report in reports:
            self._on_report(worker, report)

    def _on_report(self, worker: int, report: pb.IterationReport) -> None:
        assert self.router is not None
        prefilled, handoffs, finished = [], [], []
        for entry in report.prefilled:
            tracked = self._current(entry.request_id, entry.block, worker)
            if tracked is not None and tracked.req is not None:
                rec = tracked.req.record
                rec.prefill_start, rec.prefill_end = entry.prefill_start, entry.prefill_end
                prefilled.append(tracked.req)
                if entry.handoff:
                    tracked.handoff_tokens = list(entry.block_tokens)
                    handoffs.append(tracked.req)
        for done in report.finished:
            tracked = self._current(done.request_id, done.block, worker)
            if tracked is None or tracked.req is None:
                continue
            req, block = tracked.req, done.block
            rec = req.record
            if done.HasField("decode_start"):
                rec.decode_start, rec.decode_worker = done.decode_start, worker
            req.steps = (*req.steps[:block], done.forwards, *req.steps[block + 1 :])
            tracked.generated.extend(done.tokens)
            if done.eos and self.stop_at_eos and tracked.planned is None and block + 1 < req.n_blocks:
                req.output_len, req.steps, tracked.eos = BLOCK * (block + 1), req.steps[: block + 1], True
            req.end_block(done.end)
            finished.append(req)
            if req.finished:
                tracked.status, tracked.prompt = pb.DONE, []  # the prompt is not needed any more
                self.records.append(record_of(req))
                del self._active[tracked.id]
                self.done += 1
            self._publish(tracked)
        if prefilled or finished:
            outcome = Outcome(tuple(prefilled), tuple(handoffs), tuple(finished))
            self._apply(self.router.on_iteration(time.monotonic(), worker, outcome))

    def _current(self, rid: int, block: int, worker: int) -> Tracked | None:
        """The active request a report entry is about, or None (and a warning) if it is stale."""
        tracked = self._active.get(rid)
        if tracked is None or tracked.req is None or tracked.req.block != block:
            log.warning("worker %d reported stale block %d of request %d", worker, block, rid)
            return None
        return tracked

    def _apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Transfer):
                self._start_transfer(action)
                continue
            tracked = self._active[action.req.id]
            self.workers[action.worker].outbox.put(block_work(tracked, action.req, action.req.block))
            if tracked.status == pb.QUEUED:
                tracked.status = pb.RUNNING
                self._publish(tracked)

    # ---- KV transfers (core thread) ------------------------------------------------------------------

    def _start_transfer(self, action: Transfer) -> None:
        """The router reserved the destination's pages: order the first attempt at both ends."""
        req = action.req
        tracked = self._active[req.id]
        moving = Moving(
            next(self._transfer_ids), tracked, req, req.block, action.src, action.dst, time.monotonic(),
            list(tracked.handoff_tokens),
        )  # fmt: skip
        self._moving[moving.id] = moving
        self._attempt(moving)

    def _attempt(self, moving: Moving) -> None:
        tracked, req = moving.tracked, moving.req
        moving.attempt += 1
        moving.sent = moving.received = None
        moving.generation = self._generations.get((moving.src, moving.dst), 0)
        send = pb.TransferOrder(
            kind=pb.SEND, transfer_id=moving.id, attempt=moving.attempt, request_id=req.id,
            block=moving.block, peer=moving.dst, generation=moving.generation, pages=req.pages,
            tag=next(self._tags) % (1 << 31),
        )  # fmt: skip
        work = block_work(tracked, req, moving.block)
        receive = pb.TransferOrder()
        receive.CopyFrom(send)
        receive.kind, receive.peer, receive.step = pb.RECEIVE, moving.src, 1
        receive.work.CopyFrom(work)
        receive.block_tokens.extend(moving.block_tokens)
        self.workers[moving.dst].outbox.put(receive)
        self.workers[moving.src].outbox.put(send)

    def _on_transfer_event(self, worker: int, event: pb.TransferEvent) -> None:
        moving = self._moving.get(event.transfer_id)
        if moving is not None and moving.done and event.kind == pb.SEND and event.attempt == moving.attempt:
            return  # the send's end, reported after the destination's: nothing left to decide
        if moving is None or (event.kind != pb.RELEASE and (moving.done or event.attempt != moving.attempt)):
            log.warning("worker %d reported a stale event of KV transfer %d", worker, event.transfer_id)
            return
        assert self.router is not None
        now = time.monotonic()
        if event.kind == pb.RELEASE:  # the source's pages are free: the transfer is over
            del self._moving[moving.id]
            if not event.ok:
                log.error("worker %d could not release transfer %d: %s", worker, moving.id, event.error)
            self._apply(self.router.on_transfer_done(now, moving.req, moving.src))
            return
        if event.kind == pb.SEND:
            moving.sent = event
        else:
            moving.received = event
            if moving.link_start is None:
                moving.link_start = max(event.start, moving.decided)
        if event.kind == pb.RECEIVE and event.ok:  # the destination decodes it already
            rec = moving.req.blocks[moving.block]
            rec.transfer_start, rec.transfer_end = moving.link_start, event.end
            self.transfers_done += 1
            self._release(moving)
            return
        if moving.sent is None or moving.received is None:
            return  # the attempt is decided once both ends are done with it
        reason = moving.received.error or moving.sent.error or "unknown"
        pair = (moving.src, moving.dst)
        self._generations[pair] = max(self._generations.get(pair, 0), moving.generation + 1)
        log.warning("KV transfer %d attempt %d failed: %s", moving.id, moving.attempt, reason)
        if moving.attempt < self.transfer_attempts:
            self.transfer_retries += 1
            self._attempt(moving)
            return
        self.transfers_failed += 1
        self._release(moving)
        tracked = moving.tracked
        if self._active.pop(tracked.id, None) is not None:
            self._error(
                tracked,
                f"KV transfer of block {moving.block} from worker {moving.src} to worker {moving.dst} failed "
                f"after {moving.attempt} attempts: {reason}",
            )
        # the destination freed its pages when its receive failed
        self._apply(self.router.on_transfer_failed(now, moving.req, moving.dst))

    def _release(self, moving: Moving) -> None:
        """Tell the source to free the block's pages (its RELEASE event returns them to the tally)."""
        moving.done = True
        order = pb.TransferOrder(
            kind=pb.RELEASE, transfer_id=moving.id, attempt=moving.attempt, request_id=moving.req.id,
            block=moving.block, peer=moving.dst, pages=moving.req.pages,
        )  # fmt: skip
        self.workers[moving.src].outbox.put(order)

    def _log_row(self, report: pb.IterationReport) -> None:
        base = self.first_arrival or 0.0
        stats = report.stats
        row: list[Any] = [getattr(stats, name) for name in ITERATION_COLUMNS]
        row[ITERATION_COLUMNS.index("start")] = stats.start - base
        row[ITERATION_COLUMNS.index("end")] = stats.end - base
        budget = ITERATION_COLUMNS.index("budget")
        if math.isfinite(row[budget]) and row[budget] == int(row[budget]):
            row[budget] = int(row[budget])  # as the simulator writes it
        items = ";".join(
            f"{'p' if item.kind == pb.PREFILL else 'd'}:{item.query_tokens}:{item.context_len}"
            for item in report.items
        )
        self._log.writerow([*row, report.gpu_s, items, report.cycle_s])

    def worker_lost(self, worker: int, reason: str) -> None:
        self._post(self._fail, f"worker {worker} lost: {reason}")

    def _fail(self, reason: str) -> None:
        """The cluster cannot go on: every unfinished request ends with ERROR and this reason."""
        if self.failure:
            return
        self.failure = reason
        log.error("%s", reason)
        for tracked in self._active.values():
            self._error(tracked, reason)
        self._active.clear()
        self.on_failure()

    def _error(self, tracked: Tracked, reason: str) -> None:
        with self._lock:
            tracked.status, tracked.error, tracked.prompt = pb.ERROR, reason, []
            self.errors += 1
        self._publish(tracked)

    # ---- per-worker threads ----------------------------------------------------------------------------

    def _send_loop(self, info: WorkerInfo) -> None:
        """Carry dispatched blocks and transfer orders to one worker, batching whatever queued up meanwhile
        (the worker takes a call's blocks, then its orders; the order among orders is kept)."""
        with suppress(grpc.FutureTimeoutError):  # connect now, not on the first dispatch
            grpc.channel_ready_future(info.channel).result(timeout=rpc.CALL_TIMEOUT_S)
        while True:
            first = info.outbox.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    item = info.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    return
                batch.append(item)
            message = pb.EnqueueBatch(
                blocks=[b for b in batch if isinstance(b, pb.BlockWork)],
                transfers=[t for t in batch if isinstance(t, pb.TransferOrder)],
            )
            for attempt in range(ENQUEUE_ATTEMPTS):
                try:
                    info.stub.Enqueue(message, timeout=rpc.CALL_TIMEOUT_S)
                    break
                except grpc.RpcError as err:
                    if self.stopped.is_set():
                        return
                    if err.code() is grpc.StatusCode.INVALID_ARGUMENT or attempt == ENQUEUE_ATTEMPTS - 1:
                        self.worker_lost(info.id, f"Enqueue failed: {rpc.describe(err)}")
                        return
                    time.sleep(0.1 * 2**attempt)

    def _watchdog(self) -> None:
        failures = dict.fromkeys(self.workers, 0)
        while not self.stopped.wait(HEALTH_INTERVAL_S):
            if self.failure:
                return
            for info in list(self.workers.values()):
                reason = rpc.check_health(info.channel)
                failures[info.id] = 0 if reason is None else failures[info.id] + 1
                if reason is not None and failures[info.id] >= HEALTH_FAILURES:
                    self.worker_lost(info.id, f"health check failed: {reason}")
                    return


class SchedulerServicer(pb_grpc.SchedulerServicer):
    def __init__(self, core: SchedulerCore, shutdown: Callable[[], None]) -> None:
        self.core = core
        self.shutdown = shutdown

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.SubmitReply:
        reason = self.core.unavailable()
        if reason is not None:
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        return self.core.submit(request)

    def Poll(self, request: pb.RequestRef, context: grpc.ServicerContext) -> pb.RequestState:
        return self.core.poll(request.request_id)

    def Stream(self, request: pb.RequestRef, context: grpc.ServicerContext) -> Iterator[pb.RequestState]:
        return self.core.stream(request.request_id, context.is_active)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return self.core.status()

    def Results(self, request: pb.ResultsRequest, context: grpc.ServicerContext) -> pb.ResultsReply:
        return self.core.results()

    def Shutdown(self, request: pb.ShutdownRequest, context: grpc.ServicerContext) -> pb.ShutdownReply:
        threading.Thread(target=self.shutdown, name="shutdown", daemon=True).start()
        return pb.ShutdownReply()


class ControlServicer(pb_grpc.ControlServicer):
    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        return self.core.register(request)

    def Report(self, request: pb.ReportBatch, context: grpc.ServicerContext) -> pb.ReportReply:
        self.core._post(self.core._on_batch, request)
        return pb.ReportReply()


class SchedulerServer:
    """The scheduler's two gRPC servers around one `SchedulerCore`."""

    def __init__(
        self, core: SchedulerCore, host: str = "127.0.0.1", port: int = 0, control_port: int = 0
    ) -> None:
        self.core = core
        self.client_server = rpc.server(CLIENT_THREADS, CLIENT_MAX_RPCS)
        self.control_server = rpc.server(8)
        pb_grpc.add_SchedulerServicer_to_server(SchedulerServicer(core, self.stop), self.client_server)
        pb_grpc.add_ControlServicer_to_server(ControlServicer(core), self.control_server)
        self.health = rpc.add_health(self.client_server)
        self.address = rpc.bind(self.client_server, host, port)
        self.control_address = rpc.bind(self.control_server, "127.0.0.1", control_port)
        core.on_ready = lambda: rpc.set_serving(self.health, True)
        core.on_failure = lambda: rpc.set_serving(self.health, False)
        self._stop_lock = threading.Lock()

    def start(self) -> None:
        self.control_server.start()
        self.client_server.start()

    def stop(self) -> None:
        with self._stop_lock:
            if self.core.stopped.is_set():
                return
            rpc.set_serving(self.health, False)
            self.core.stop()
            self.client_server.stop(grace=0.5).wait(2.0)
            self.control_server.stop(grace=0.2).wait(2.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m executor.scheduler", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, required=True, help="workers that will register (ids 0..N-1)")
    parser.add_argument("--mode", default="colocated")
    parser.add_argument("--mask-len", type=int, default=1024)
    parser.add_argument("--theta", type=int, default=8192)
    parser.add_argument(
        "--transfer-attempts", type=int, default=TRANSFER_ATTEMPTS, help="per KV transfer, before ERROR"
    )
    parser.add_argument("--seed", type=int, default=0, help="router tie-breaks (the sim's 'router' stream)")
    parser.add_argument("--stop-at-eos", action="store_true", help="end a request after the block with EOS")
    parser.add_argument("--host", default="127.0.0.1", help="client-facing address")
    parser.add_argument("--port", type=int, default=50051)
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument(
        "--ready-file", type=Path, help="write the bound addresses here (JSON) once listening"
    )
    parser.add_argument("--iteration-log", type=Path)
    parser.add_argument("--exit-with-parent", action="store_true")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rpc.setup_logging("scheduler", args.log_level)
    try:
        core = SchedulerCore(
            args.workers,
            mask_len=args.mask_len,
            theta=args.theta,
            seed=args.seed,
            stop_at_eos=args.stop_at_eos,
            iteration_log=args.iteration_log,
            mode=args.mode,
            transfer_attempts=args.transfer_attempts,
        )
        server = SchedulerServer(core, args.host, args.port, args.control_port)
    except (ValueError, OSError) as err:
        print(f"scheduler: error: {err}", file=sys.stderr, flush=True)
        return 2

    def on_signal(signum: int, frame: object) -> None:
        threading.Thread(target=server.stop, name="shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    if args.exit_with_parent:
        rpc.exit_with_parent(server.stop)
    if args.ready_file is not None:
        info = {"address": server.address, "control": server.control_address, "pid": os.getpid()}
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(args.ready_file)
    while not core.stopped.wait(0.5):
        pass
    server.stop()  # idempotent: waits for the servers if another thread began the stop
    return 0


if __name__ == "__main__":
    sys.exit(main())
