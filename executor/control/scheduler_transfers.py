"""The scheduler's side of KV transfers: a state machine from the router's `Transfer` to the source's
release, fed the workers' transfer events and answering with typed effects (no clock, no I/O).

One transfer moves a prefilled block's KV from its source (a prefill worker) to its destination (a
decode-role worker whose pages the router reserved). Each attempt orders RECEIVE at the destination (the
block's work, its 32 ids after the prefill, the pages to allocate) and SEND at the source, both with the
attempt's tag and the pair's link generation. The destination decodes as soon as its KV is in place and
says so (a RECEIVE event, which precedes every report of that decode): that success orders RELEASE at
the source, and the source's RELEASE event ends the transfer (its pages go back to the router's tally).
An attempt that failed at the destination is decided once both ends have reported: the pair's generation
goes up (both ends rebuild their process group) and the attempt is repeated, up to `attempts`; then the
transfer is given up: the destination has freed its pages already, the source is told to release its
own, and the request fails.

A block's transfer time runs from the destination's first RECEIVE start (its link thread took it, after
the transfers before it on that pair), but never before the router's decision, to the KV's arrival in
its pages, retries included: the interval the simulator's link model charges.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from executor.control.messages import BlockWork, Logprobs, TransferEvent, TransferKind, TransferOrder
from sangam.request import Request

log = logging.getLogger("sangam.scheduler")

TAG_LIMIT = 1 << 31  # tags travel as the links' int32; 0 is the links' warm-up


@dataclass(slots=True, eq=False)
class KVTransfer:
    """One KV transfer the router ordered, across its attempts."""

    id: int
    req: Request
    block: int
    src: int
    dst: int
    decided: float  # the router's decision
    work: BlockWork  # what the destination decodes once the KV is in place
    block_tokens: tuple[int, ...]  # the block's ids after the prefill's unmasking
    block_logprobs: Logprobs | None  # and theirs, if the request asked
    link_start: float | None = None  # the destination's link thread took its first attempt
    attempt: int = 0
    generation: int = 0
    sent: TransferEvent | None = None  # the current attempt's ends, once reported
    received: TransferEvent | None = None
    done: bool = False  # the KV arrived, or the transfer was given up: only the source's release is left


@dataclass(frozen=True, slots=True)
class Order:
    """Send `order` to `worker`."""

    worker: int
    order: TransferOrder


@dataclass(frozen=True, slots=True)
class Arrived:
    """The KV is in the destination's pages, which decodes the block: its transfer took [start, end]."""

    transfer: KVTransfer
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Released:
    """The source freed the block's pages: the transfer is over."""

    transfer: KVTransfer


@dataclass(frozen=True, slots=True)
class GivenUp:
    """The last attempt failed: the request fails with `reason`; the destination freed its pages."""

    transfer: KVTransfer
    reason: str


Effect = Order | Arrived | Released | GivenUp


class Transfers:
    """Every KV transfer not yet released by its source, and each worker pair's link generation."""

    def __init__(self, attempts: int) -> None:
        if attempts < 1:
            raise ValueError(f"transfer attempts must be at least 1, got {attempts}")
        self.attempts = attempts
        self.done = self.failed = self.retries = 0
        self._live: dict[int, KVTransfer] = {}
        self._ids = itertools.count()
        self._tags = itertools.count(1)
        self._generations: dict[tuple[int, int], int] = {}  # (src, dst) -> the pair's link generation

    @property
    def in_flight(self) -> int:
        """Transfers ordered and not yet released by their source."""
        return len(self._live)

    def start(
        self, now: float, req: Request, src: int, dst: int, work: BlockWork, block_tokens: tuple[int, ...],
        block_logprobs: Logprobs | None = None,
    ) -> list[Effect]:  # fmt: skip
        """The router reserved the destination's pages: the first attempt's orders at both ends."""
        transfer = KVTransfer(
            next(self._ids), req, req.block, src, dst, now, work, block_tokens, block_logprobs
        )
        self._live[transfer.id] = transfer
        return self._attempt(transfer)

    def forget(self, request_id: int) -> None:
        """The request's transfer (if any) is void: the router sent the request back to routing or ended
        it, and its ends were told to drop it; their later events are stale."""
        for transfer in [t for t in self._live.values() if t.req.id == request_id]:
            del self._live[transfer.id]

    def on_worker_lost(self, worker: int, pairs: Sequence[tuple[int, int]]) -> None:
        """Forget the transfers `worker` was an end of (the router recalled their requests) and raise the
        generation of each of its (source, destination) `pairs`, so that the survivors and a restarted
        process build fresh links instead of using the dead one's."""
        for transfer in [t for t in self._live.values() if worker in (t.src, t.dst)]:
            del self._live[transfer.id]
        for pair in pairs:
            self._generations[pair] = self._generations.get(pair, 0) + 1

    def on_event(self, worker: int, event: TransferEvent) -> list[Effect]:
        """One end of an attempt, or the source's release, reported by `worker`; an event of another
        worker's end is refused."""
        transfer = self._live.get(event.transfer_id)
        if transfer is None:
            return self._stale(worker, event)
        end = transfer.dst if event.kind is TransferKind.RECEIVE else transfer.src
        if worker != end:
            log.warning(
                "worker %d reported the %s end of KV transfer %d, which is worker %d's: refused",
                worker, event.kind.value, transfer.id, end,
            )  # fmt: skip
            return []
        if event.kind is TransferKind.RELEASE:
            del self._live[transfer.id]
            if not event.ok:
                log.error("worker %d could not release transfer %d: %s", worker, transfer.id, event.error)
            return [Released(transfer)]
        current = event.attempt == transfer.attempt
        if transfer.done:  # the send's end of the last attempt may come after the decision
            return [] if current and event.kind is TransferKind.SEND else self._stale(worker, event)
        if not current:
            return self._stale(worker, event)
        if event.kind is TransferKind.SEND:
            transfer.sent = event
        else:
            transfer.received = event
            if transfer.link_start is None:
                transfer.link_start = max(event.start, transfer.decided)
        if event.kind is TransferKind.RECEIVE and event.ok:
            self.done += 1
            assert transfer.link_start is not None
            return [Arrived(transfer, transfer.link_start, event.end), self._release(transfer)]
        if transfer.sent is None or transfer.received is None:
            return []  # an attempt is decided once both ends are done with it
        return self._failed(transfer, transfer.received.error or transfer.sent.error or "unknown")

    def _failed(self, transfer: KVTransfer, reason: str) -> list[Effect]:
        pair = (transfer.src, transfer.dst)
        self._generations[pair] = max(self._generations.get(pair, 0), transfer.generation + 1)
        log.warning("KV transfer %d attempt %d failed: %s", transfer.id, transfer.attempt, reason)
        if transfer.attempt < self.attempts:
            self.retries += 1
            return self._attempt(transfer)
        self.failed += 1
        why = (
            f"KV transfer of block {transfer.block} from worker {transfer.src} to worker {transfer.dst} "
            f"failed after {transfer.attempt} attempts: {reason}"
        )
        return [self._release(transfer), GivenUp(transfer, why)]

    def _attempt(self, transfer: KVTransfer) -> list[Effect]:
        transfer.attempt += 1
        transfer.sent = transfer.received = None
        transfer.generation = self._generations.get((transfer.src, transfer.dst), 0)
        tag = next(self._tags) % TAG_LIMIT
        common = (transfer.id, transfer.attempt, transfer.req.id, transfer.block)
        receive = TransferOrder(
            TransferKind.RECEIVE, *common, peer=transfer.src, pages=transfer.req.pages,
            generation=transfer.generation, tag=tag, work=transfer.work, block_tokens=transfer.block_tokens,
            step=1, block_logprobs=transfer.block_logprobs,
        )  # fmt: skip
        send = TransferOrder(
            TransferKind.SEND, *common, peer=transfer.dst, pages=transfer.req.pages,
            generation=transfer.generation, tag=tag,
        )  # fmt: skip
        return [Order(transfer.dst, receive), Order(transfer.src, send)]

    def _release(self, transfer: KVTransfer) -> Order:
        """Tell the source to free the block's pages (its RELEASE event ends the transfer)."""
        transfer.done = True
        order = TransferOrder(
            TransferKind.RELEASE, transfer.id, transfer.attempt, transfer.req.id, transfer.block,
            peer=transfer.dst, pages=transfer.req.pages,
        )  # fmt: skip
        return Order(transfer.src, order)

    @staticmethod
    def _stale(worker: int, event: TransferEvent) -> list[Effect]:
        log.warning("worker %d reported a stale event of KV transfer %d", worker, event.transfer_id)
        return []
