"""The scheduler's state and decisions, without threads or gRPC: registrations, submissions, the router
driven by the workers' reports, KV transfers, and the cluster's failure.

`register` and `submit` may be called from any thread (they hold the lock); everything else runs on one
thread, the scheduler's core thread, in the order events arrived. Work for a worker leaves through
`send(worker, item)`; clients read each request's `Tracked.state`, a snapshot replaced (never changed) on
every update, and may wait on `Tracked.changed`, set when it is replaced; the states of requests
submitted with `watch` also go to `watch(state)` as they are published (the scheduler's Watch streams).

Lost workers (`on_worker_lost`, from the process's exit, failed health checks or silence while holding
work): the router sends their requests back to routing at their last finished block, its `Drop` actions
reach the surviving ends as `DropOrder`s, its `Fail` actions end requests with ERROR. The lost worker is
fenced: its reports (and any report naming a request its sender does not hold, or from an unknown worker)
are refused and logged, until a new process registers under its id (a new incarnation) and rejoins.

The scheduler keeps each request's token ids (prompt and committed blocks) because every block starts
with a prefill over the whole sequence, and that prefill may land on any worker (KV is freed at every
block end). Worker reports bring the 32 ids of each finished block, never whole sequences.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from executor.control.admission import check_registration, check_submission
from executor.control.iteration_log import IterationLog
from executor.control.messages import (
    BlockWork,
    ClusterStatus,
    DropOrder,
    IterationReport,
    Logprobs,
    ModelFacts,
    Registered,
    Registration,
    ReportBatch,
    RequestState,
    RequestStatus,
    Sampling,
    Submission,
    TransferOrder,
    WorkerState,
)
from executor.control.scheduler_transfers import Arrived, Effect, Order, Released, Transfers
from runs.config import RunConfig
from runs.results import RecoveryCounts, block_parts
from sangam.batcher import Outcome
from sangam.budget import Policy
from sangam.hardware import BLOCK
from sangam.layout import Layout, Role, parse_mode
from sangam.request import Request
from sangam.router import Action, Drop, Fail, Recovery, Router, Transfer

TRANSFER_ATTEMPTS = 3  # per KV transfer, before its request fails
CANCELLED = "cancelled by the client"

log = logging.getLogger("sangam.scheduler")

Send = Callable[[int, BlockWork | TransferOrder | DropOrder], None]


@dataclass(slots=True, eq=False)
class Tracked:
    """One submitted request as the scheduler sees it; `state` is the snapshot clients read."""

    id: int
    arrival: float
    prompt: list[int]
    n_blocks: int
    planned: tuple[int, ...] | None  # forced forwards per block
    sampling: Sampling
    req: Request | None = None  # None for a request rejected at Submit
    handoff_tokens: tuple[int, ...] = ()  # the handed-off block's ids after its prefill
    handoff_logprobs: Logprobs | None = None  # and theirs, if asked
    holders: tuple[int, ...] = ()  # the workers whose reports of the current block are accepted
    # Dispatched and not yet prefilled: a decode or an end of the block reported now is of work dropped
    # before (a survivor's decode of KV from a lost worker, re-dispatched to the same survivor).
    prefill_due: bool = False
    generated: list[int] = field(default_factory=list)
    logprobs: Logprobs | None = None  # of `generated`, if the request asked (`Sampling.logprobs`)
    status: RequestStatus = RequestStatus.QUEUED
    error: str = ""
    eos: bool = False
    watched: bool = False  # its published states go to `SchedulerState.watch`
    state: RequestState = field(init=False)
    changed: threading.Event = field(default_factory=threading.Event)  # set (and replaced) on publish


@dataclass(slots=True, eq=False)
class WorkerInfo:
    registration: Registration
    role: str
    incarnation: int = 0  # registrations of this worker id before this one
    last_report: float | None = (
        None  # when its last accepted report batch came (or silence was first checked)
    )
    free_pages: int | None = None  # as last reported
    lost: bool = False  # declared lost: fenced until a new process registers
    lost_reason: str = ""  # why (while lost)
    given_up: bool = False  # lost for good: the launcher will start no new process for it


def block_work(tracked: Tracked, req: Request, block: int) -> BlockWork:
    """What a worker needs to run `block` of `req`: the whole sequence's ids so far, and its schedule."""
    return BlockWork(
        request_id=req.id,
        arrival=req.arrival,
        block=block,
        prompt_len=req.prompt_len,
        mask_len=req.mask_len,
        tokens=(*tracked.prompt, *tracked.generated),
        forwards=tracked.planned[block] if tracked.planned else 0,
        sampling=tracked.sampling,
    )


def latency_parts(req: Request) -> dict[str, Any]:
    """A finished request's `RequestState` timing fields, summed over its blocks."""
    queue = prefill = decode = 0.0
    transfers = []
    for rec in req.blocks:
        prefill_queue, prefill_s, decode_queue, transfer, decode_s = block_parts(rec)
        queue += prefill_queue + decode_queue
        prefill, decode = prefill + prefill_s, decode + decode_s
        if rec.transfer_start is not None:
            transfers.append(transfer)
    overflows = sum(rec.overflow for rec in req.blocks)
    return dict(
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        transfer_s=tuple(transfers),
        overflow_blocks=overflows,
    )


class SchedulerState:
    """Central state and the router; `clock` gives the times the router and the records see."""

    def __init__(
        self,
        workers: int,
        *,
        send: Send,
        clock: Callable[[], float],
        mask_len: int,
        theta: int = 8192,
        policy: Policy = Policy.DEFICIT,
        seed: int = 0,
        stop_at_eos: bool = False,
        mode: str = "colocated",
        transfer_attempts: int = TRANSFER_ATTEMPTS,
        iteration_log: IterationLog | None = None,
        restarts: bool = False,
    ) -> None:
        layout = parse_mode(mode, workers)
        if layout.num_workers != workers:
            raise ValueError(f"mode {mode!r} names {layout.num_workers} workers, not {workers}")
        if mask_len <= 0 or mask_len % BLOCK:
            raise ValueError(f"mask length must be a positive multiple of {BLOCK}, got {mask_len}")
        self.layout: Layout = layout
        self.mask_len = mask_len  # the largest mask buffer a request may have (`--mask-len`)
        self.theta = theta
        self.policy = policy
        self.seed = seed
        self.stop_at_eos = stop_at_eos
        self.send = send
        self.clock = clock
        self.watch: Callable[[RequestState], None] = lambda state: None
        self.iteration_log = iteration_log
        self.restarts = restarts  # lost workers are restarted: a layout left unable to serve waits for them
        self.transfers = Transfers(transfer_attempts)
        self.router: Router | None = None  # built once every worker has registered (pages known)
        self.facts: ModelFacts | None = None
        self.workers: dict[int, WorkerInfo] = {}
        self.failure = ""
        self.tracked: dict[int, Tracked] = {}
        self.records: list[Request] = []  # finished requests
        self.first_arrival: float | None = None
        self.submitted = self.done = self.errors = self.iterations = 0
        self._active: dict[int, Tracked] = {}  # core thread only
        self._ids = itertools.count()
        self._lock = threading.Lock()  # ids, arrivals and registrations

    @property
    def complete(self) -> bool:
        """Every worker has registered: requests can be placed."""
        return self.router is not None

    # ---- any thread ------------------------------------------------------------------------------------

    def register(self, reg: Registration) -> Registered:
        """Add a worker, or a new process for a lost one (its next incarnation, which the core thread
        then rejoins with `on_worker_joined`); a repeated registration of the same process is accepted
        again."""
        with self._lock:
            if self.failure:
                return Registered(f"the cluster has failed: {self.failure}")
            old = self.workers.get(reg.worker_id)
            if old is not None and not old.lost:
                same = (old.registration.address, old.registration.pid) == (reg.address, reg.pid)
                error = None if same else f"worker {reg.worker_id} is already registered"
                return Registered(error, old.incarnation)
            if old is not None and old.registration.pid == reg.pid:
                return Registered(f"worker {reg.worker_id} (pid {reg.pid}) was declared lost")
            others = (
                w.registration for w in self.workers.values() if w.registration.worker_id != reg.worker_id
            )
            error = check_registration(reg, self.layout, others)
            if error is not None:
                return Registered(error)
            role = self.layout.roles[reg.worker_id].value
            incarnation = 0 if old is None else old.incarnation + 1
            self.workers[reg.worker_id] = WorkerInfo(reg, role, incarnation)
            if old is not None:
                log.warning("worker %d registered again (pid %d, incarnation %d)", reg.worker_id, reg.pid,
                            incarnation)  # fmt: skip
                return Registered(None, incarnation)
            if len(self.workers) == self.layout.num_workers:
                pages = min(w.registration.pages for w in self.workers.values())
                context = min(w.registration.context_len for w in self.workers.values())
                self.facts = ModelFacts(reg.vocab, reg.mask_id, reg.eos_ids, pages, reg.model, context)
                rng = RunConfig(gpus=self.layout.num_workers, theta=self.theta, seed=self.seed).rng("router")
                self.router = Router(self.layout, pages, rng, self.theta, policy=self.policy)
        log.info("worker %d registered at %s (%s)", reg.worker_id, reg.address, reg.device)
        return Registered(None, 0)

    def refusal(self, batch: ReportBatch) -> str | None:
        """Why a report batch is refused as a whole (its sender is no registered, current worker), or None."""
        with self._lock:
            info = self.workers.get(batch.worker_id)
            if info is None:
                return f"no worker {batch.worker_id} is registered"
            if info.lost or batch.incarnation != info.incarnation:
                return f"worker {batch.worker_id} (incarnation {batch.incarnation}) was declared lost"
        return None

    def submit(self, sub: Submission) -> Tracked:
        """Record one request, accepted or (with the reason) not; the caller checked `complete` first.
        An accepted one still needs `on_arrival` on the core thread."""
        assert self.facts is not None
        reason = check_submission(sub, self.facts, self.mask_len)
        n_blocks = sub.gen_len // BLOCK if reason is None else 0
        planned = sub.forwards or None
        with self._lock:
            rid, arrival = next(self._ids), self.clock()
            if self.first_arrival is None and reason is None:
                self.first_arrival = arrival
            prompt = list(sub.prompt) if reason is None else []
            watched = sub.watch and reason is None
            tracked = Tracked(rid, arrival, prompt, n_blocks, planned, sub.sampling, watched=watched)
            if sub.sampling.logprobs is not None and reason is None:
                tracked.logprobs = Logprobs(top=sub.sampling.logprobs)
            self.tracked[rid] = tracked
            self.submitted += 1
            if reason is not None:
                tracked.status, tracked.error = RequestStatus.ERROR, reason
                self.errors += 1
            else:
                steps = planned or (BLOCK,) * n_blocks
                tracked.req = Request(rid, arrival, len(prompt), sub.gen_len, sub.response_len, steps)
            self._publish(tracked)
        return tracked

    def poll(self, rid: int) -> RequestState:
        tracked = self.tracked.get(rid)
        if tracked is None:
            return RequestState(rid, RequestStatus.NOT_FOUND, f"no request {rid}")
        return tracked.state

    def status(self) -> ClusterStatus:
        router = self.router
        workers = []
        for wid in sorted(self.workers):
            info = self.workers[wid]
            pages = info.registration.pages
            free = pages if info.free_pages is None else info.free_pages
            reg = info.registration
            state = WorkerState(
                wid,
                info.role,
                pages,
                free,
                router_free=router.free[wid] if router else 0,
                outstanding=router.outstanding[wid] if router else 0,
                lost=info.lost,
                pid=reg.pid,
                device=reg.device,
                lost_reason=info.lost_reason if info.lost else "",
                forwards_at_risk=router.forwards_at_risk(wid) if router else 0,
            )
            workers.append(state)
        return ClusterStatus(
            ready=self.complete and not self.failure,
            workers_expected=self.layout.num_workers,
            workers_registered=len(self.workers),
            submitted=self.submitted,
            done=self.done,
            errors=self.errors,
            iterations=self.iterations,
            failure=self.failure,
            mask_len=self.mask_len,
            layout=self.layout.name,
            transfers_done=self.transfers.done,
            transfers_failed=self.transfers.failed,
            transfer_retries=self.transfers.retries,
            transfers_in_flight=self.transfers.in_flight,
            first_arrival=self.first_arrival or 0.0,
            workers=tuple(workers),
            facts=self.facts,
            recovery=self.recovery,
        )

    @property
    def recovery(self) -> RecoveryCounts:
        """What lost workers cost the run so far (the router's tallies; none before it exists)."""
        r = self.router
        if r is None:
            return RecoveryCounts()
        return RecoveryCounts(r.workers_lost, r.requests_recovered, r.forwards_redone, r.requests_failed)

    # ---- core thread -----------------------------------------------------------------------------------

    def on_arrival(self, tracked: Tracked) -> None:
        if self.failure:
            self._error(tracked, self.failure)
            return
        assert self.router is not None and tracked.req is not None
        self._active[tracked.id] = tracked
        self._apply(self.router.on_arrival(self.clock(), tracked.req))

    def on_batch(self, batch: ReportBatch) -> None:
        """One worker's report batch: its transfer events first, then its iterations. A batch `refusal`
        names a reason for is logged and changes nothing (its sender may have been lost since)."""
        reason = self.refusal(batch)
        if reason is not None:
            log.warning("report refused: %s", reason)
            return
        info = self.workers[batch.worker_id]
        info.last_report = self.clock()
        if batch.free_pages is not None:
            info.free_pages = batch.free_pages
        if not self.failure:
            for event in batch.transfers:
                self._on_effects(self.transfers.on_event(batch.worker_id, event))
        self.iterations += len(batch.iterations)
        if self.iteration_log is not None:
            self.iteration_log.write(batch.iterations, self.first_arrival or 0.0)
        if self.failure:
            return
        for report in batch.iterations:
            self._on_report(batch.worker_id, report)

    def on_worker_lost(
        self, worker: int, reason: str, incarnation: int | None = None, final: bool = False
    ) -> None:
        """Worker `worker` is gone (of its process `incarnation`, if given: a later one stays): fence
        it and recover its requests; `final`: the launcher gave it up, no new process will follow (also
        for a worker lost before). If the layout can no longer serve and no restart is coming, the
        cluster fails."""
        info = self.workers.get(worker)
        if info is None or (incarnation is not None and incarnation != info.incarnation):
            return
        if info.lost:
            if final and not info.given_up:
                info.given_up, info.lost_reason = True, reason
                log.warning("worker %d given up: %s", worker, reason)
                self._fail_unless_serving(worker, reason)
            return
        with self._lock:
            info.lost = True
        info.lost_reason, info.given_up = reason, final
        log.warning("worker %d lost: %s", worker, reason)
        if self.router is None or self.failure:
            self.fail(f"worker {worker} lost: {reason}")
            return
        actions = self.router.on_worker_lost(self.clock(), worker)
        self.transfers.on_worker_lost(worker, self._pairs(worker))
        self._apply(actions)
        self._fail_unless_serving(worker, reason)

    def _fail_unless_serving(self, worker: int, reason: str) -> None:
        """Fail the cluster if its layout cannot serve and no lost worker will come back."""
        assert self.router is not None
        coming = self.restarts and any(w.lost and not w.given_up for w in self.workers.values())
        if not self.router.can_serve and not coming and not self.failure:
            self.fail(f"worker {worker} lost ({reason}) and {self.router.missing}")

    def on_worker_joined(self, worker: int) -> None:
        """A new process of lost worker `worker` has registered: it takes work again."""
        assert self.router is not None
        if self.failure or self.router.up[worker]:
            return
        log.warning("worker %d rejoined", worker)
        self._apply(self.router.on_worker_joined(self.clock(), worker))

    def lose_silent(self, timeout: float) -> None:
        """Declare lost every worker that holds work and has not reported for `timeout` seconds."""
        now = self.clock()
        holding = {w for t in self._active.values() for w in t.holders}
        for wid, info in sorted(self.workers.items()):
            if info.last_report is None:
                info.last_report = now
            if wid in holding and not info.lost and now - info.last_report > timeout:
                self.on_worker_lost(wid, f"no report for {timeout:g} s while holding work")

    def _pairs(self, worker: int) -> list[tuple[int, int]]:
        """The KV link pairs (source, destination) `worker` is an end of."""
        roles = self.layout.roles
        if roles[worker] is Role.PREFILL:
            return [(worker, w) for w, r in enumerate(roles) if r is not Role.PREFILL]
        return [(w, worker) for w, r in enumerate(roles) if r is Role.PREFILL]

    def cancel(self, rid: int) -> None:
        """The client gave request `rid` up: unless it has ended, each worker holding its work or KV is
        told to drop it, the router forgets it, and it ends with ERROR (`CANCELLED`)."""
        tracked = self._active.get(rid)
        if tracked is None or tracked.req is None:
            return
        assert self.router is not None
        self._apply(self.router.cancel(self.clock(), tracked.req))
        self._end_failed(rid, CANCELLED)

    def fail(self, reason: str) -> bool:
        """The cluster cannot go on: every unfinished request ends with ERROR and this reason. False if it
        had failed already."""
        if self.failure:
            return False
        self.failure = reason
        log.error("%s", reason)
        for tracked in self._active.values():
            self._error(tracked, reason)
        self._active.clear()
        return True

    def _on_report(self, worker: int, report: IterationReport) -> None:
        assert self.router is not None
        prefilled, handoffs, finished = [], [], []
        for entry in report.prefilled:
            tracked = self._current(entry.request_id, entry.block, worker, prefill=True)
            if tracked is not None and tracked.req is not None:
                tracked.prefill_due = False
                rec = tracked.req.record
                rec.prefill_start, rec.prefill_end = entry.prefill_start, entry.prefill_end
                tracked.req.step = 1  # the prefill is the block's first forward
                prefilled.append(tracked.req)
                if entry.handoff:
                    tracked.handoff_tokens = entry.block_tokens
                    tracked.handoff_logprobs = entry.block_logprobs
                    handoffs.append(tracked.req)
        for rid in report.decoded:  # forwards a lost worker's block would have to redo
            tracked = self._active.get(rid)
            if tracked is None or tracked.req is None or tracked.prefill_due:
                continue
            if worker in tracked.holders:
                tracked.req.step += 1
        for done in report.finished:
            tracked = self._current(done.request_id, done.block, worker)
            if tracked is None or tracked.req is None:
                continue
            req, block = tracked.req, done.block
            rec = req.record
            if done.decode_start is not None:
                rec.decode_start, rec.decode_worker = done.decode_start, worker
            req.steps = (*req.steps[:block], done.forwards, *req.steps[block + 1 :])
            tracked.generated.extend(done.tokens)
            if tracked.logprobs is not None and done.logprobs is not None:
                tracked.logprobs += done.logprobs
            if done.eos and self.stop_at_eos and tracked.planned is None and block + 1 < req.n_blocks:
                req.output_len, req.steps, tracked.eos = BLOCK * (block + 1), req.steps[: block + 1], True
            req.end_block(done.end)
            finished.append(req)
            if req.finished:
                tracked.status, tracked.prompt = RequestStatus.DONE, []  # the prompt is not needed any more
                self.records.append(req)
                del self._active[tracked.id]
                self.done += 1
            self._publish(tracked)
        if prefilled or finished:
            outcome = Outcome(tuple(prefilled), tuple(handoffs), tuple(finished))
            self._apply(self.router.on_iteration(self.clock(), worker, outcome))

    def _current(self, rid: int, block: int, worker: int, prefill: bool = False) -> Tracked | None:
        """The active request a report entry (of a `prefill`, else of the block's end) is about, or None
        (and a warning) if it is stale or its sender does not hold it."""
        tracked = self._active.get(rid)
        if tracked is None or tracked.req is None or tracked.req.block != block:
            log.warning("worker %d reported stale block %d of request %d", worker, block, rid)
            return None
        if worker not in tracked.holders:
            log.warning("worker %d reported request %d, which it does not hold: refused", worker, rid)
            return None
        if tracked.prefill_due and not prefill:
            log.warning("worker %d reported block %d of request %d before its prefill", worker, block, rid)
            return None
        return tracked

    def _apply(self, actions: Sequence[Action | Recovery]) -> None:
        for action in actions:
            req = action.req
            if isinstance(action, Fail):
                self._end_failed(req.id, action.reason)
                continue
            tracked = self._active[req.id]
            if isinstance(action, Drop):
                self.drop(tracked, action.worker)
                continue
            if isinstance(action, Transfer):
                work = block_work(tracked, req, req.block)
                tracked.holders = (action.src, action.dst)
                effects = self.transfers.start(
                    self.clock(), req, action.src, action.dst, work, tracked.handoff_tokens,
                    tracked.handoff_logprobs,
                )  # fmt: skip
                self._on_effects(effects)
                continue
            tracked.holders, tracked.prefill_due = (action.worker,), True
            self.send(action.worker, block_work(tracked, req, req.block))
            if tracked.status is RequestStatus.QUEUED:
                tracked.status = RequestStatus.RUNNING
                self._publish(tracked)

    def _on_effects(self, effects: Sequence[Effect]) -> None:
        assert self.router is not None
        for effect in effects:
            if isinstance(effect, Order):
                self.send(effect.worker, effect.order)
                continue
            transfer = effect.transfer
            if isinstance(effect, Arrived):
                rec = transfer.req.blocks[transfer.block]
                rec.transfer_start, rec.transfer_end = effect.start, effect.end
            elif isinstance(effect, Released):
                self._apply(self.router.on_transfer_done(self.clock(), transfer.req, transfer.src))
            else:
                tracked = self._active.pop(transfer.req.id, None)
                if tracked is not None:
                    self._error(tracked, effect.reason)
                # the destination freed its pages when its receive failed
                self._apply(self.router.on_transfer_failed(self.clock(), transfer.req, transfer.dst))

    def drop(self, tracked: Tracked, worker: int) -> None:
        """Have `worker` forget the request (its block, pages and transfer ends) and refuse its reports of
        it from now on; the request's KV transfer, if any, is void."""
        self.transfers.forget(tracked.id)
        tracked.holders = tuple(w for w in tracked.holders if w != worker)
        self.send(worker, DropOrder(tracked.id))

    def _end_failed(self, rid: int, reason: str) -> None:
        """The request cannot be served: it ends with ERROR and `reason`."""
        self.transfers.forget(rid)
        tracked = self._active.pop(rid, None)
        if tracked is not None:
            tracked.holders = ()
            self._error(tracked, reason)

    def _error(self, tracked: Tracked, reason: str) -> None:
        with self._lock:
            tracked.status, tracked.error, tracked.prompt = RequestStatus.ERROR, reason, []
            self.errors += 1
        self._publish(tracked)

    def _publish(self, t: Tracked) -> None:
        """Replace the request's client-visible snapshot (never mutated once published)."""
        req = t.req
        end = req.blocks[-1].end if req is not None and req.finished else None
        t.state = RequestState(
            request_id=t.id,
            status=t.status,
            error=t.error,
            token_ids=tuple(t.generated),
            blocks_done=req.block if req is not None else 0,
            n_blocks=req.n_blocks if req is not None else t.n_blocks,
            eos=t.eos,
            arrival=t.arrival,
            end=end or 0.0,
            forwards=tuple(req.steps[: req.block]) if req is not None else (),
            logprobs=t.logprobs,
            **(latency_parts(req) if req is not None and req.finished else {}),
        )  # before the swap: a stream that sees the new event sees this state
        changed, t.changed = t.changed, threading.Event()
        changed.set()  # wakes only this request's streams
        if t.watched:
            self.watch(t.state)
