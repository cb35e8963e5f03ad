"""Routers of the three layouts, driven by hand-written outcomes."""

from __future__ import annotations

import random

from factories import make_request

from sangam.batcher import Outcome
from sangam.budget import Policy
from sangam.layout import parse_mode
from sangam.request import Request
from sangam.router import Dispatch, Router, Transfer


def router(
    mode: str, pages: int = 1000, theta: int = 8192, seed: int = 0, policy: Policy = Policy.DEFICIT
) -> Router:
    return Router(parse_mode(mode), pages, random.Random(seed), theta, policy=policy)


def prefilled(*reqs: Request, handoff: bool = False) -> Outcome:
    for req in reqs:
        req.step = 1
    return Outcome(reqs, reqs if handoff else (), ())


def block_ended(req: Request, now: float) -> Outcome:
    req.end_block(now)
    return Outcome((), (), (req,))


def test_colocated_sends_each_prefill_to_the_least_outstanding_worker() -> None:
    r = router("3C")
    a, b, c, d = (make_request(i, s, arrival=i) for i, s in enumerate([500, 300, 100, 50]))
    targets = [r.on_arrival(float(x.id), x)[0] for x in (a, b, c)]
    assert sorted(t.worker for t in targets if isinstance(t, Dispatch)) == [0, 1, 2]
    least = min(range(3), key=lambda w: r.outstanding[w])
    assert r.on_arrival(4.0, d) == [Dispatch(d, least)]
    assert d.record.dispatch == 4.0 and d.record.prefill_worker == least


def test_colocated_tie_break_is_seeded() -> None:
    picks = []
    for _ in range(2):
        r = router("4C", seed=7)
        picks.append([r.on_arrival(0.0, make_request(i, 100))[0] for i in range(4)])
    assert [a.worker for a in picks[0]] == [b.worker for b in picks[1]]


def test_colocated_releases_the_charge_at_prefill_and_routes_the_next_block_afresh() -> None:
    r = router("2C")
    req = make_request(1, 400, steps=(2, 2))
    (first,) = r.on_arrival(0.0, req)
    r.on_arrival(0.0, make_request(2, 100))  # the other worker now holds 100
    assert r.on_iteration(1.0, first.worker, prefilled(req)) == []
    assert r.outstanding[first.worker] == 0
    (second,) = r.on_iteration(2.0, first.worker, block_ended(req, 2.0))
    assert second.worker == first.worker  # 0 outstanding beats 100
    assert req.block == 1 and req.record.dispatch == 2.0


def test_disaggregated_prefill_then_transfer_to_the_decode_worker_with_most_free_pages() -> None:
    r = router("2P2D", pages=100)
    req = make_request(1, 16 * 10, steps=(3,))
    (dispatch,) = r.on_arrival(0.0, req)
    assert dispatch.worker in (0, 1)
    assert r.free[dispatch.worker] == 90
    r.free[3] -= 5  # worker 2 now has the most free pages
    (transfer,) = r.on_iteration(1.0, dispatch.worker, prefilled(req, handoff=True))
    assert transfer == Transfer(req, dispatch.worker, 2)
    assert r.free[2] == 90 and req.record.decode_worker == 2
    assert r.on_transfer_done(1.5, req, dispatch.worker) == []
    assert r.free[dispatch.worker] == 100
    r.on_iteration(3.0, 2, block_ended(req, 3.0))
    assert r.free[2] == 100 and req.finished


def test_disaggregated_holds_prefilled_kv_until_decode_pages_free_up() -> None:
    r = router("1P1D", pages=10)
    a, b = make_request(1, 16 * 8, arrival=0, steps=(3, 3)), make_request(2, 16 * 8, arrival=1, steps=(3,))
    r.on_arrival(0.0, a)
    (ta,) = r.on_iteration(1.0, 0, prefilled(a, handoff=True))
    assert isinstance(ta, Transfer)
    r.on_transfer_done(1.1, a, 0)
    r.on_arrival(1.2, b)
    assert r.on_iteration(2.0, 0, prefilled(b, handoff=True)) == []  # decode worker full
    assert r.num_decode_ready == 1
    actions = r.on_iteration(3.0, 1, block_ended(a, 3.0))
    assert actions[0] == Transfer(b, 0, 1)  # completed prefills before new prefills
    assert r.num_pending == 1  # a's next block waits: the prefill worker still holds b's KV


def test_a_failed_transfer_voids_the_reservation_and_lets_the_held_kv_move() -> None:
    r = router("1P1D", pages=10)
    a, b = make_request(1, 16 * 8, arrival=0, steps=(3,)), make_request(2, 16 * 8, arrival=1, steps=(3,))
    r.on_arrival(0.0, a)
    (ta,) = r.on_iteration(1.0, 0, prefilled(a, handoff=True))
    assert ta == Transfer(a, 0, 1) and r.free[1] == 2
    r.on_transfer_done(1.1, a, 0)  # the source released a's pages (the attempt failed, a is given up)
    r.on_arrival(1.2, b)
    assert r.on_iteration(2.0, 0, prefilled(b, handoff=True)) == []  # a's void reservation blocks b
    assert r.on_transfer_failed(2.5, a, 1) == [Transfer(b, 0, 1)]
    assert r.free[1] == 2 and r.num_decode_ready == 0


def test_disaggregated_queues_when_no_prefill_worker_has_pages() -> None:
    r = router("1P1D", pages=10)
    a, b = make_request(1, 16 * 6, arrival=0), make_request(2, 16 * 6, arrival=1)
    assert len(r.on_arrival(0.0, a)) == 1
    assert r.on_arrival(0.5, b) == [] and r.num_pending == 1


def test_hybrid_does_not_overflow_while_a_prefill_worker_is_under_theta() -> None:
    r = router("2P2C", theta=1000)
    actions = [r.on_arrival(0.0, make_request(i, 600, arrival=i))[0] for i in range(4)]
    assert [a.worker for a in actions if isinstance(a, Dispatch)][:2] in ([0, 1], [1, 0])
    assert all(a.worker in (0, 1) for a in actions[:3])  # 600 < 1000 somewhere until both hold >= 1000
    assert not any(a.req.record.overflow for a in actions[:3] if isinstance(a, Dispatch))


def test_hybrid_overflows_to_the_least_loaded_colocated_worker_when_every_prefill_worker_is_over_theta() -> (
    None
):
    r = router("2P2C", theta=1000)
    for i in range(4):  # 0 and 1 each reach 1200 outstanding
        r.on_arrival(0.0, make_request(i, 600, arrival=i))
    r.outstanding[2] = 300
    over = make_request(9, 600, arrival=9)
    (action,) = r.on_arrival(1.0, over)
    assert action == Dispatch(over, 3) and over.record.overflow
    assert r.free[3] == 1000 - over.pages


def test_hybrid_overflow_leaves_pages_for_prefilled_requests_waiting_to_decode() -> None:
    r = router("1P1C", pages=20, theta=100)
    waiting = make_request(1, 16 * 8, arrival=0, steps=(3,))
    r.on_arrival(0.0, waiting)
    r.free[1] = 10  # the colocated worker is nearly full
    r.outstanding[0] = 500  # prefill pool over theta
    r._decode_ready.append((waiting.arrival, waiting.id, waiting, 0))  # prefilled, needs 8 pages there
    r.free[1] = 5  # not enough for it yet
    late = make_request(2, 16 * 4, arrival=1)  # 4 pages: fits alone, not beside the backlog
    assert r.on_arrival(1.0, late) == [] and r.num_pending == 1


def test_hybrid_drains_prefilled_kv_before_pending_prefills() -> None:
    """Colocated pages that come free go first to a prefilled request waiting to decode (Algorithm 2's
    pending decodes), then to the pending prefills: here the waiting prefill would take them and strand
    the prefilled KV on the prefill worker, as the overflow check counts the backlog only in total."""
    r = router("1P2C", pages=20, theta=100)
    r.free[2] = 5  # colocated worker 2 holds another request's KV throughout
    x = make_request(1, 16 * 16, arrival=0.0, steps=(3,))  # 16 pages
    assert r.on_arrival(0.0, x) == [Dispatch(x, 0)]
    assert r.on_iteration(0.5, 0, prefilled(x, handoff=True)) == [Transfer(x, 0, 1)]
    assert r.on_transfer_done(0.6, x, 0) == [] and r.free[:2] == [20, 4]
    w = make_request(2, 16 * 12, arrival=1.0, steps=(3,))  # 12 pages
    assert r.on_arrival(1.0, w) == [Dispatch(w, 0)]  # 192 outstanding tokens: the prefill pool is over theta
    p = make_request(3, 16 * 9, arrival=2.0)  # 9 pages: none free for it on any worker
    assert r.on_arrival(2.0, p) == []
    assert r.on_iteration(3.0, 0, prefilled(w, handoff=True)) == []  # w's KV needs 12 pages to decode
    assert (r.num_decode_ready, r.num_pending) == (1, 1)
    # x's block ends: worker 1 has 20 free pages, enough for w (then 8 are left, too few for p) or p
    assert r.on_iteration(4.0, 1, block_ended(x, 4.0)) == [Transfer(w, 0, 1)]
    assert r.free == [8, 8, 5] and (r.num_decode_ready, r.num_pending) == (0, 1)
    assert r.on_transfer_done(4.1, w, 0) == [Dispatch(p, 0)]  # the prefill worker's pages are back
    assert not p.record.overflow and p.record.dispatch == 4.1


def test_hybrid_pending_queue_is_head_of_line_by_original_arrival() -> None:
    r = router("1P1C", pages=10, theta=10_000)
    big = make_request(1, 16 * 9, arrival=0.0)
    assert r.on_arrival(0.0, big) == [Dispatch(big, 0)]  # 1 page left on the prefill worker
    old = make_request(2, 16 * 9, arrival=0.5)
    assert r.on_arrival(0.5, old) == [Dispatch(old, 1)] and old.record.overflow  # no pages: overflow
    third = make_request(3, 16 * 5, arrival=2.0)
    fourth = make_request(4, 16, arrival=3.0)
    assert r.on_arrival(2.0, third) == []
    assert r.on_arrival(3.0, fourth) == []  # one page would do, but it may not pass the head
    assert r.num_pending == 2
    big.step = 1
    actions = r.on_iteration(4.0, 0, Outcome((big,), (), ()))
    assert actions == []  # big's KV still holds the prefill worker's pages


def test_fastdllm_holds_the_worker_from_first_prefill_to_last_block() -> None:
    r = router("1C", policy=Policy.FASTDLLM)
    a = make_request(1, 100, arrival=0.0, steps=(2, 2))
    b = make_request(2, 100, arrival=0.5, steps=(2,))
    assert r.on_arrival(0.0, a) == [Dispatch(a, 0)]
    assert r.on_arrival(0.5, b) == [] and r.num_pending == 1  # the worker is a's
    assert r.on_iteration(1.0, 0, prefilled(a)) == []
    assert r.on_iteration(2.0, 0, block_ended(a, 2.0)) == [Dispatch(a, 0)]  # a's next block, not b
    assert r.num_pending == 1 and r.holder == [a.id]
    r.on_iteration(3.0, 0, prefilled(a))
    assert r.on_iteration(4.0, 0, block_ended(a, 4.0)) == [Dispatch(b, 0)]  # a is done: b's turn
    assert a.finished and r.holder == [b.id] and b.record.dispatch == 4.0


def test_fastdllm_sends_every_block_back_to_its_worker_and_arrivals_wait_in_order() -> None:
    r = router("2C", policy=Policy.FASTDLLM)
    a, b = make_request(1, 100, arrival=0.0, steps=(1, 1)), make_request(2, 5000, arrival=0.1, steps=(1,))
    c, d = make_request(3, 100, arrival=0.2, steps=(1,)), make_request(4, 100, arrival=0.3, steps=(1,))
    (da,) = r.on_arrival(0.0, a)
    (db,) = r.on_arrival(0.1, b)
    assert {da.worker, db.worker} == {0, 1}
    assert r.on_arrival(0.2, c) == [] and r.on_arrival(0.3, d) == []
    r.on_iteration(1.0, da.worker, prefilled(a))
    # a's second block goes back to its own worker, though the other one is as idle (b's prefill ran)
    r.on_iteration(1.0, db.worker, prefilled(b))
    assert r.on_iteration(1.5, da.worker, block_ended(a, 1.5)) == [Dispatch(a, da.worker)]
    r.on_iteration(2.0, da.worker, prefilled(a))
    assert r.on_iteration(2.5, da.worker, block_ended(a, 2.5)) == [Dispatch(c, da.worker)]  # c before d
    assert r.on_iteration(3.0, db.worker, block_ended(b, 3.0)) == [Dispatch(d, db.worker)]


def test_fastdllm_routes_a_held_requests_next_block_before_pending_prefills() -> None:
    """The prefill worker's pages that come free go first to the next block of a request that holds its
    decode worker, then to the pending prefills (here one that has claimed a worker but found no pages)."""
    r = router("1P3D", pages=10, policy=Policy.FASTDLLM)
    a = make_request(1, 16 * 8, arrival=0.0, steps=(3, 3))  # 8 pages a block: one at a time on worker 0
    b, c = make_request(2, 16 * 8, arrival=1.0, steps=(3,)), make_request(3, 16 * 8, arrival=1.5, steps=(3,))
    assert r.on_arrival(0.0, a) == [Dispatch(a, 0)]
    da = r.holder.index(a.id)
    assert r.on_iteration(0.5, 0, prefilled(a, handoff=True)) == [Transfer(a, 0, da)]
    assert r.on_transfer_done(0.6, a, 0) == []
    assert r.on_arrival(1.0, b) == [Dispatch(b, 0)]
    assert r.on_arrival(1.5, c) == [] and c.id in r.holder  # c holds the last decode worker, not the pages
    assert r.on_iteration(2.0, da, block_ended(a, 2.0)) == []  # a's second block waits for the pages too
    db = r.holder.index(b.id)
    assert r.on_iteration(3.0, 0, prefilled(b, handoff=True)) == [Transfer(b, 0, db)]
    assert r.on_transfer_done(3.1, b, 0) == [Dispatch(a, 0)]  # a's block, though c waits as well
    assert r.num_pending == 1 and r.free[0] == 2


def test_fastdllm_disaggregated_decodes_every_block_on_the_claimed_worker() -> None:
    r = router("1P2D", pages=100, policy=Policy.FASTDLLM)
    a = make_request(1, 16 * 10, arrival=0.0, steps=(3, 3))
    b, c = (
        make_request(2, 16 * 10, arrival=0.1, steps=(3,)),
        make_request(3, 16 * 10, arrival=0.2, steps=(3,)),
    )
    assert r.on_arrival(0.0, a) == [Dispatch(a, 0)]
    assert r.on_arrival(0.1, b) == [Dispatch(b, 0)]  # a second decode worker is free
    assert r.on_arrival(0.2, c) == [] and r.num_pending == 1  # none is: c waits, prefill worker or not
    held = r.holder.index(a.id)
    (ta,) = r.on_iteration(1.0, 0, prefilled(a, handoff=True))
    assert ta == Transfer(a, 0, held)
    r.on_transfer_done(1.1, a, 0)
    assert r.on_iteration(2.0, held, block_ended(a, 2.0)) == [Dispatch(a, 0)]
    r.free[1 + 2 - held] += 50  # more free pages on b's worker do not draw a's KV away from its own
    assert r.on_iteration(3.0, 0, prefilled(a, handoff=True)) == [Transfer(a, 0, held)]
    r.on_transfer_done(3.1, a, 0)
    assert r.on_iteration(4.0, held, block_ended(a, 4.0)) == [Dispatch(c, 0)]
    assert r.holder[held] == c.id
