"""`Router.cancel`: a client gives a request up at each stage of its block; exact actions and books."""

from __future__ import annotations

import random

from factories import make_request

from sangam.batcher import Outcome
from sangam.budget import Policy
from sangam.layout import parse_mode
from sangam.request import Request
from sangam.router import Dispatch, Drop, Router, Transfer


def router(mode: str, pages: int = 100, policy: Policy = Policy.DEFICIT) -> Router:
    return Router(parse_mode(mode), pages, random.Random(0), policy=policy)


def prefilled(req: Request, *, handoff: bool = False) -> Outcome:
    req.step = 1
    return Outcome((req,), (req,) if handoff else (), ())


def test_a_waiting_request_leaves_the_queue_and_the_next_one_goes_instead() -> None:
    r = router("1P1D", pages=10)
    a, b = make_request(1, 16 * 8, arrival=0), make_request(2, 16 * 8, arrival=1)
    c = make_request(3, 16 * 8, arrival=2)
    assert r.on_arrival(0.0, a) == [Dispatch(a, 0)]
    assert r.on_arrival(1.0, b) == [] and r.on_arrival(2.0, c) == []  # the prefill worker is full
    assert r.cancel(3.0, b) == []  # b only waited: nothing to drop, nothing freed
    assert r.num_pending == 1
    assert r.cancel(4.0, a) == [Drop(a, 0), Dispatch(c, 0)]  # a's pages free up for c, b is skipped
    assert r.free[0] == 2 and r.outstanding[0] == c.seq_len and r.num_pending == 0


def test_a_dispatched_prefill_is_dropped_on_its_worker_and_its_charge_released() -> None:
    r = router("2C")
    req = make_request(1, 400)
    (dispatch,) = r.on_arrival(0.0, req)
    assert r.outstanding[dispatch.worker] == 400
    assert r.cancel(1.0, req) == [Drop(req, dispatch.worker)]
    assert r.outstanding == [0, 0]
    assert r.cancel(2.0, req) == []  # a second cancel (or one after the end) changes nothing


def test_a_decoding_block_is_dropped_where_it_decodes() -> None:
    r = router("1C")
    req = make_request(1, 64, steps=(3, 3))
    r.on_arrival(0.0, req)
    assert r.on_iteration(1.0, 0, prefilled(req)) == []
    assert r.cancel(2.0, req) == [Drop(req, 0)]
    req.end_block(3.0)  # a report already on its way: the block ended before the drop arrived
    assert r.on_iteration(3.0, 0, Outcome((), (), ())) == []  # nothing of req is routed again
    assert r.num_pending == 0


def test_held_kv_waiting_for_decode_pages_is_dropped_at_the_source() -> None:
    r = router("1P1D", pages=10)
    a, b = make_request(1, 16 * 8, arrival=0, steps=(3,)), make_request(2, 16 * 8, arrival=1, steps=(3,))
    r.on_arrival(0.0, a)
    assert r.on_iteration(1.0, 0, prefilled(a, handoff=True)) == [Transfer(a, 0, 1)]
    r.on_transfer_done(1.1, a, 0)
    r.on_arrival(1.2, b)
    assert r.on_iteration(2.0, 0, prefilled(b, handoff=True)) == []  # decode worker full: b is held
    assert r.num_decode_ready == 1
    assert r.cancel(2.5, b) == [Drop(b, 0)]
    assert r.num_decode_ready == 0 and r.free[0] == 10


def test_a_moving_block_is_dropped_at_both_ends_and_both_reservations_return() -> None:
    r = router("1P1D", pages=10)
    req = make_request(1, 16 * 8, steps=(3,))
    r.on_arrival(0.0, req)
    assert r.on_iteration(1.0, 0, prefilled(req, handoff=True)) == [Transfer(req, 0, 1)]
    assert r.free == [2, 2]
    assert r.cancel(1.5, req) == [Drop(req, 0), Drop(req, 1)]
    assert r.free == [10, 10]


def test_fastdllm_cancel_frees_the_claimed_worker_for_the_next_arrival() -> None:
    r = router("1C", policy=Policy.FASTDLLM)
    a, b = make_request(1, 64, arrival=0, steps=(3, 3)), make_request(2, 64, arrival=1)
    assert r.on_arrival(0.0, a) == [Dispatch(a, 0)]
    assert r.on_arrival(1.0, b) == []  # a holds the only worker
    assert r.cancel(2.0, a) == [Drop(a, 0), Dispatch(b, 0)]
    assert r.holder == [b.id]
