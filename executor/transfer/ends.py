"""A worker's own ends of KV transfers (disaggregated and hybrid layouts), beside its engine.

A prefill-role worker keeps each handed-off block's KV (`keep`) until the scheduler's RELEASE; a SEND
packs those pages for the peer. A RECEIVE allocates pages here for a block the scheduler's order
carries, receives into them, and the block then joins the Batcher's decodes. Each end's result is
emitted as a `TransferEvent` into the worker's report stream (`Engine.emit`). A block dropped while its
KV is being received keeps its pages until the receive ends: the link thread writes into them till then.
A receive still waiting for its peer (a lost worker never comes) is told to stop waiting, and a receive
refused here (no room for its KV, a bad order) tells its sender at once through the link.

Everything here changes the engine's jobs, batcher and pool, so it runs under the engine's lock (from
the gRPC threads that carry orders and the link threads that finish transfers). The engine
(`executor.worker.engine.Engine`) is seen only through `WorkerEngine`, what the ends need of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from executor.control.admission import check_work
from executor.control.messages import BlockWork, Logprobs, TransferEvent, TransferKind, TransferOrder
from executor.transfer.links import KVTransfers, TransferError, TransferJob, TransferResult
from sangam.batcher import Batcher
from sangam.hardware import BLOCK, pages_for


class WorkerEngine(Protocol):
    """What the ends need of the worker's engine; every call is made under its lock."""

    @property
    def worker_id(self) -> int: ...

    @property
    def batcher(self) -> Batcher: ...

    def emit(self, event: TransferEvent) -> None:
        """Put a transfer event on the worker's report stream."""

    def free(self, local: int) -> None:
        """Forget the job `local`, which holds pages outside the batcher's queues, and free its pages."""

    def receiving_job(
        self, work: BlockWork, call: int, block_tokens: Sequence[int], step: int, pages: int,
        block_logprobs: Logprobs | None = None,
    ) -> tuple[int, tuple[int, ...]]:  # fmt: skip
        """A new job for a block whose KV is received here, resumed at `step` with `block_tokens` (and
        their `block_logprobs`, if asked), and `pages` pages allocated to it: its local id and the
        pages."""

    def start_decode(self, local: int) -> None:
        """The job `local`, its KV received, joins the batcher's decodes."""


class TransferEnds:
    """The KV this worker keeps for transfers out, and receives for transfers in."""

    def __init__(self, engine: WorkerEngine, links: KVTransfers | None) -> None:
        self.engine = engine
        self.links = links
        self.handed: dict[tuple[int, int], int] = {}  # (request id, block) -> local id: prefilled, KV kept
        self.receiving: dict[tuple[int, int], int] = {}  # (transfer id, attempt) -> local id of the KV
        self.cancelled: set[int] = set()  # local ids dropped while their KV is being received
        self.receive_jobs: dict[int, TransferJob] = {}  # local id -> its receive in flight

    def keep(self, request_id: int, block: int, local: int) -> None:
        """A prefilled block handed off: its KV stays here until the scheduler's RELEASE."""
        self.handed[request_id, block] = local

    def forget(self, local: int) -> bool:
        """A dropped job's transfer ends: False if its KV is being received (its pages are freed when the
        receive ends), else True (the caller frees them now)."""
        if local in self.receiving.values():
            self.cancelled.add(local)
            if (receive := self.receive_jobs.get(local)) is not None:
                receive.dropped.set()  # still waiting for its peer: it stops
            return False
        for key in [k for k, v in self.handed.items() if v == local]:
            del self.handed[key]
        return True

    def order(self, order: TransferOrder, call: int) -> None:
        """Carry out one order (`call`: the Enqueue call that brought it): a RELEASE, or an order that
        cannot start, emits its event at once; otherwise the link thread's result comes to `done`."""
        try:
            if order.kind is TransferKind.RELEASE:
                self.engine.emit(self._release(order))
                return
            if self.links is None:
                raise TransferError(f"worker {self.engine.worker_id} has no KV links (colocated layout)")
            if order.kind is TransferKind.SEND:
                self._send(order)
            else:
                self._receive(order, call)
        except (TransferError, ValueError, MemoryError) as err:
            now = time.monotonic()
            self.engine.emit(
                TransferEvent(order.kind, order.transfer_id, order.attempt, False, str(err), now, now)
            )
            if order.kind is TransferKind.RECEIVE and self.links is not None:
                # the sender would wait for this end until its deadline: it learns at once
                with contextlib.suppress(TransferError):
                    refusal = replace(_transfer_job(order, ()), refused=str(err))
                    self.links.refuse(order.peer, refusal)

    def done(self, result: TransferResult) -> None:
        """A link thread finished one end of an attempt: a received block joins the decodes at once, and
        the event is emitted (before the engine's lock is let go: it precedes every report of the decode)."""
        job = result.job
        event = TransferEvent(
            TransferKind.SEND if result.send else TransferKind.RECEIVE, job.transfer_id, job.attempt,
            result.ok, result.error, result.start, result.end, result.nbytes,
        )  # fmt: skip
        if not result.send:
            local = self.receiving.pop((job.transfer_id, job.attempt))
            self.receive_jobs.pop(local, None)
            if local in self.cancelled:  # dropped meanwhile: its pages are free to reuse now
                self.cancelled.discard(local)
                self.engine.free(local)
            elif result.ok:
                self.engine.start_decode(local)
            else:
                self.engine.free(local)
        self.engine.emit(event)

    def _send(self, order: TransferOrder) -> None:
        assert self.links is not None
        local = self.handed.get((order.request_id, order.block))
        if local is None:
            raise TransferError(f"no prefilled KV of request {order.request_id} block {order.block} here")
        pages = tuple(self.engine.batcher.pool.pages_of(local))
        self.links.send(order.peer, _transfer_job(order, pages))

    def _receive(self, order: TransferOrder, call: int) -> None:
        assert self.links is not None
        work = order.work
        if work is None:
            raise ValueError(f"request {order.request_id}: a receive order without its block")
        reason = check_work(work)
        if reason is not None:
            raise ValueError(reason)
        if order.pages != pages_for(work.prompt_len + work.mask_len) or len(order.block_tokens) != BLOCK:
            raise ValueError(
                f"request {order.request_id}: a transfer order of {order.pages} pages does not fit"
            )
        if not 1 <= order.step < BLOCK:
            raise ValueError(f"request {order.request_id}: cannot resume a block at step {order.step}")
        engine = self.engine
        pool = engine.batcher.pool
        if not pool.can_allocate(order.pages):
            raise MemoryError(f"no room for the KV: {order.pages} pages needed, {pool.num_free} free")
        local, pages = engine.receiving_job(
            work, call, order.block_tokens, order.step, order.pages, order.block_logprobs
        )
        self.receiving[order.transfer_id, order.attempt] = local
        self.receive_jobs[local] = receive = _transfer_job(order, pages)
        try:
            self.links.receive(order.peer, receive)
        except TransferError:
            engine.free(local)
            del self.receiving[order.transfer_id, order.attempt]
            del self.receive_jobs[local]
            raise

    def _release(self, order: TransferOrder) -> TransferEvent:
        local = self.handed.pop((order.request_id, order.block), None)
        if local is None:
            raise TransferError(f"no KV of request {order.request_id} block {order.block} to release here")
        self.engine.free(local)
        now = time.monotonic()
        return TransferEvent(TransferKind.RELEASE, order.transfer_id, order.attempt, True, start=now, end=now)


def _transfer_job(order: TransferOrder, pages: tuple[int, ...]) -> TransferJob:
    return TransferJob(order.transfer_id, order.attempt, order.request_id, order.tag, order.generation, pages)
