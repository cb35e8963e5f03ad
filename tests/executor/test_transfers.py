"""The scheduler's KV transfer state machine, fed exact worker events: every order and effect it answers."""

from __future__ import annotations

from executor.control.messages import BlockWork, TransferEvent, TransferKind, TransferOrder
from executor.control.scheduler_transfers import Arrived, GivenUp, KVTransfer, Order, Released, Transfers
from sangam.request import Request

SRC, DST = 0, 1
RECEIVE, SEND, RELEASE = TransferKind.RECEIVE, TransferKind.SEND, TransferKind.RELEASE
IDS = tuple(range(32))  # the block's ids after its prefill


def request(rid: int = 7) -> Request:
    return Request(rid, 0.0, 20, 64, 64, (4, 4))  # 84 tokens: 6 pages


def work(req: Request) -> BlockWork:
    return BlockWork(req.id, req.arrival, req.block, req.prompt_len, req.mask_len, tuple(range(1, 21)), 4)


def started(
    transfers: Transfers, req: Request, now: float = 10.0, src: int = SRC, dst: int = DST
) -> KVTransfer:
    transfers.start(now, req, src, dst, work(req), IDS)
    (transfer,) = [t for t in transfers._live.values() if t.req is req]
    return transfer


def orders(req: Request, attempt: int, generation: int, tag: int) -> list[Order]:
    """An attempt's orders: RECEIVE at the destination first, then SEND at the source."""
    common = (0, attempt, req.id, 0)
    receive = TransferOrder(
        RECEIVE, *common, peer=SRC, pages=6, generation=generation, tag=tag, work=work(req),
        block_tokens=IDS, step=1,
    )  # fmt: skip
    send = TransferOrder(SEND, *common, peer=DST, pages=6, generation=generation, tag=tag)
    return [Order(DST, receive), Order(SRC, send)]


def release(req: Request, attempt: int) -> Order:
    return Order(SRC, TransferOrder(RELEASE, 0, attempt, req.id, 0, peer=DST, pages=6))


def event(
    kind: TransferKind, attempt: int, ok: bool = True, start: float = 11.0, end: float = 12.0
) -> TransferEvent:
    return TransferEvent(kind, 0, attempt, ok, "" if ok else f"{kind.value} broke", start, end)


def test_a_transfer_orders_both_ends_releases_the_source_once_the_kv_arrived_and_ends_on_its_release() -> (
    None
):
    transfers, req = Transfers(3), request()
    assert transfers.start(10.0, req, SRC, DST, work(req), IDS) == orders(req, 1, 0, 1)
    transfer = next(iter(transfers._live.values()))
    assert transfers.on_event(SRC, event(SEND, 1)) == []  # the send's end alone decides nothing
    assert transfers.on_event(DST, event(RECEIVE, 1, start=11.0, end=12.5)) == [
        Arrived(transfer, 11.0, 12.5),
        release(req, 1),
    ]
    assert transfers.in_flight == 1  # the source still holds its pages
    assert transfers.on_event(SRC, event(RELEASE, 1)) == [Released(transfer)]
    assert (transfers.in_flight, transfers.done, transfers.failed, transfers.retries) == (0, 1, 0, 0)


def test_the_source_is_released_on_the_destinations_success_even_before_the_send_ends() -> None:
    transfers, req = Transfers(3), request()
    transfer = started(transfers, req)
    assert transfers.on_event(DST, event(RECEIVE, 1)) == [Arrived(transfer, 11.0, 12.0), release(req, 1)]
    assert transfers.on_event(SRC, event(SEND, 1)) == []  # late, expected: no second release
    assert transfers.on_event(SRC, event(RELEASE, 1)) == [Released(transfer)]


def test_a_transfer_starts_when_the_link_takes_it_but_never_before_the_routers_decision() -> None:
    transfers, req = Transfers(3), request()
    transfer = started(transfers, req, now=11.5)
    assert transfers.on_event(DST, event(RECEIVE, 1, start=11.0, end=12.0))[0] == Arrived(
        transfer, 11.5, 12.0
    )


def test_a_failed_attempt_is_decided_once_both_ends_reported_and_retried_with_the_next_generation() -> None:
    transfers, req = Transfers(3), request()
    transfer = started(transfers, req)
    assert transfers.on_event(DST, event(RECEIVE, 1, ok=False, start=11.0)) == []
    assert transfers.on_event(SRC, event(SEND, 1, ok=False)) == orders(req, 2, 1, 2)
    assert transfers.retries == 1
    assert transfers.on_event(DST, event(RECEIVE, 1)) == []  # a stale end of the first attempt
    assert transfers.on_event(SRC, event(SEND, 2)) == []
    # the transfer ran from the first attempt's start, retries included
    assert transfers.on_event(DST, event(RECEIVE, 2, start=13.0, end=14.0)) == [
        Arrived(transfer, 11.0, 14.0),
        release(req, 2),
    ]
    assert transfers.on_event(SRC, event(RELEASE, 2)) == [Released(transfer)]
    assert (transfers.done, transfers.failed, transfers.retries) == (1, 0, 1)


def test_the_failure_is_decided_by_whichever_end_reports_last() -> None:
    transfers, req = Transfers(3), request()
    started(transfers, req)
    assert transfers.on_event(SRC, event(SEND, 1, ok=False)) == []
    assert transfers.on_event(DST, event(RECEIVE, 1, ok=False)) == orders(req, 2, 1, 2)


def test_after_the_last_attempt_the_source_is_released_and_the_request_fails_with_the_reason() -> None:
    transfers, req = Transfers(2), request()
    transfer = started(transfers, req)
    transfers.on_event(DST, event(RECEIVE, 1, ok=False))
    assert transfers.on_event(SRC, event(SEND, 1)) == orders(req, 2, 1, 2)
    transfers.on_event(SRC, event(SEND, 2, ok=False))
    reason = "KV transfer of block 0 from worker 0 to worker 1 failed after 2 attempts: receive broke"
    assert transfers.on_event(DST, event(RECEIVE, 2, ok=False)) == [
        release(req, 2),
        GivenUp(transfer, reason),
    ]
    assert transfers.in_flight == 1  # until the source has freed its pages
    assert transfers.on_event(SRC, event(RELEASE, 2)) == [Released(transfer)]
    assert (transfers.in_flight, transfers.done, transfers.failed, transfers.retries) == (0, 0, 1, 1)


def test_a_pairs_generation_outlives_the_transfer_that_raised_it_and_is_the_pairs_own() -> None:
    transfers = Transfers(1)
    first, second, third = request(1), request(2), request(3)
    started(transfers, first)
    transfers.on_event(DST, event(RECEIVE, 1, ok=False))
    transfers.on_event(SRC, event(SEND, 1, ok=False))
    assert transfers.start(20.0, second, SRC, DST, work(second), IDS)[0].order.generation == 1
    assert transfers.start(20.0, third, SRC, 2, work(third), IDS)[0].order.generation == 0


def test_events_of_unknown_transfers_change_nothing() -> None:
    transfers, req = Transfers(3), request()
    started(transfers, req)
    assert transfers.on_event(DST, TransferEvent(RECEIVE, 99, 1, True)) == []
    assert transfers.on_event(DST, event(RECEIVE, 2)) == []  # an attempt not ordered yet
    assert (transfers.in_flight, transfers.done) == (1, 0)


def test_an_event_of_the_other_end_or_a_third_worker_is_refused() -> None:
    transfers, req = Transfers(3), request()
    started(transfers, req)
    assert transfers.on_event(SRC, event(RECEIVE, 1)) == []  # the source cannot report the receive
    assert transfers.on_event(2, event(RECEIVE, 1)) == []
    assert transfers.on_event(DST, event(RELEASE, 1)) == []  # nor the destination the release
    assert (transfers.in_flight, transfers.done) == (1, 0)


def test_a_lost_worker_voids_its_transfers_and_raises_its_pairs_generations() -> None:
    transfers = Transfers(3)
    first, second = request(1), request(2)
    started(transfers, first)
    started(transfers, second, src=SRC, dst=2)
    transfers.on_worker_lost(DST, [(SRC, DST)])
    assert transfers.in_flight == 1 and transfers.on_event(DST, event(RECEIVE, 1)) == []
    transfers.forget(second.id)
    assert transfers.in_flight == 0
    assert transfers.start(20.0, request(3), SRC, DST, work(request(3)), IDS)[0].order.generation == 1
