"""Algorithm 1, case by case."""

from __future__ import annotations

import math

from factories import make_batcher, make_request, seat_decodes

from sangam.budget import Policy


def test_figure6_deficit_carries_budget_until_a_large_prefill_fits() -> None:
    batcher = make_batcher(budget=1024)
    decodes = seat_decodes(batcher, 8)  # D = 256 tokens
    p1, p2, p3 = (make_request(i, s, arrival=i) for i, s in [(1, 300), (2, 400), (3, 900)])
    for p in (p3, p1, p2):  # queue order follows arrival, not insertion
        batcher.add_prefill(p)

    first = batcher.next_microbatch(0.0)
    assert first.decodes == tuple(decodes)
    assert first.prefills == (p1, p2)
    assert (first.budget, first.deficit_before, first.deficit_after) == (768, 0, 68)
    batcher.complete(first, 1.0)

    second = batcher.next_microbatch(1.0)  # p1 and p2 now decode: D = 320
    assert len(second.decodes) == 10 and second.prefills == ()
    assert (second.budget, second.deficit_after) == (1024 - 320 + 68, 772)
    batcher.complete(second, 2.0)

    third = batcher.next_microbatch(2.0)
    assert third.prefills == (p3,)
    assert (third.budget, third.deficit_after) == (1024 - 320 + 772, 1476 - 900)
    batcher.complete(third, 3.0)

    fourth = batcher.next_microbatch(3.0)  # nothing waits: deficit cleared
    assert fourth.prefills == () and fourth.waiting == 0
    assert (fourth.deficit_before, fourth.deficit_after, batcher.deficit) == (576, 0, 0)


def test_idle_rule_admits_an_oversized_head_alone() -> None:
    batcher = make_batcher(budget=1024)
    big, small = make_request(1, 3000, arrival=1), make_request(2, 100, arrival=2)
    batcher.add_prefill(small)
    batcher.add_prefill(big)
    mb = batcher.next_microbatch(0.0)
    assert mb.prefills == (big,)
    assert mb.budget == 1024 and mb.deficit_after == 0
    assert batcher.num_waiting == 1


def test_idle_rule_needs_an_empty_microbatch() -> None:
    batcher = make_batcher(budget=1024)
    seat_decodes(batcher, 1)
    batcher.add_prefill(make_request(1, 3000))
    mb = batcher.next_microbatch(0.0)
    assert mb.prefills == ()
    assert mb.deficit_after == 1024 - 32


def test_head_of_line_blocks_smaller_later_prefills() -> None:
    batcher = make_batcher(budget=1024)
    seat_decodes(batcher, 4)
    batcher.add_prefill(make_request(1, 1000, arrival=1))
    batcher.add_prefill(make_request(2, 10, arrival=2))
    mb = batcher.next_microbatch(0.0)
    assert mb.prefills == ()
    assert mb.deficit_after == 1024 - 128


def test_reprefill_of_an_older_request_goes_first() -> None:
    batcher = make_batcher(budget=1024)
    seat_decodes(batcher, 1)
    fresh = make_request(1, 600, arrival=5.0)
    old = make_request(2, 600, arrival=1.0)
    old.block = 0
    batcher.add_prefill(fresh)
    batcher.add_prefill(old)
    assert batcher.next_microbatch(0.0).prefills == (old,)


def test_memory_wait_stops_admission_and_banks_no_fresh_budget() -> None:
    batcher = make_batcher(budget=1024, pages=10)
    seat_decodes(batcher, 2, seq_len=16)  # 2 pages held, 8 free; D = 64
    batcher.deficit = 300
    head = make_request(1, 16 * 9, arrival=1)  # 9 pages: fits the budget, not the memory
    batcher.add_prefill(head)
    batcher.add_prefill(make_request(2, 16, arrival=2))
    mb = batcher.next_microbatch(0.0)
    assert mb.prefills == () and mb.memory_blocked
    assert mb.deficit_after == 300  # only the previous deficit survives
    assert batcher.pool.num_free == 8


def test_memory_wait_debits_the_deficit_it_spent() -> None:
    batcher = make_batcher(budget=256, pages=20)
    seat_decodes(batcher, 2, seq_len=16)  # D = 64, fresh budget 192
    batcher.deficit = 300
    batcher.add_prefill(make_request(1, 16 * 18, arrival=1))  # 288 tokens, 18 pages: fits
    batcher.add_prefill(make_request(2, 16 * 5, arrival=2))  # 5 pages: no memory left
    mb = batcher.next_microbatch(0.0)
    assert len(mb.prefills) == 1 and mb.memory_blocked
    assert mb.deficit_after == 300 - (288 - 192)


def test_decode_cap_leaves_extra_decodes_waiting() -> None:
    batcher = make_batcher(max_decodes=3)
    seat_decodes(batcher, 5)
    assert len(batcher.next_microbatch(0.0).decodes) == 3


def test_prefill_first_admits_everything_that_fits_memory() -> None:
    batcher = make_batcher(policy=Policy.PREFILL_FIRST)
    seat_decodes(batcher, 8)
    for i in range(3):
        batcher.add_prefill(make_request(i, 4000, arrival=i))
    mb = batcher.next_microbatch(0.0)
    assert len(mb.prefills) == 3
    assert mb.budget == math.inf and mb.deficit_after == 0


def test_fastdllm_serves_one_request_at_a_time() -> None:
    batcher = make_batcher(policy=Policy.FASTDLLM)
    a, b = make_request(1, 100, arrival=1, steps=(2,)), make_request(2, 100, arrival=2, steps=(2,))
    batcher.add_prefill(a)
    batcher.add_prefill(b)
    first = batcher.next_microbatch(0.0)
    assert first.prefills == (a,)
    batcher.complete(first, 1.0)
    second = batcher.next_microbatch(1.0)
    assert second.decodes == (a,) and second.prefills == ()
    batcher.complete(second, 2.0)
    assert batcher.next_microbatch(2.0).prefills == (b,)


def test_block_lifecycle_prefill_then_decodes_then_pages_freed() -> None:
    batcher = make_batcher()
    req = make_request(1, 100, steps=(3, 1))
    batcher.add_prefill(req)
    mb = batcher.next_microbatch(0.0)
    out = batcher.complete(mb, 1.0)
    assert out.prefilled == (req,) and out.finished == () and batcher.pool.holds(1)
    batcher.complete(batcher.next_microbatch(1.0), 2.0)
    out = batcher.complete(batcher.next_microbatch(2.0), 3.0)
    assert out.finished == (req,) and not batcher.pool.holds(1)
    assert req.block == 1 and req.blocks[0].end == 3.0 and req.blocks[1].ready == 3.0
    assert req.blocks[0].prefill_start == 0.0 and req.blocks[0].decode_start == 1.0


def test_a_one_forward_block_ends_at_its_prefill() -> None:
    batcher = make_batcher()
    req = make_request(1, 100, steps=(1, 4))
    batcher.add_prefill(req)
    out = batcher.complete(batcher.next_microbatch(0.0), 0.5)
    assert out.finished == (req,) and batcher.pool.num_used == 0
    assert req.blocks[0].decode_start is None and req.blocks[0].end == 0.5


def test_hand_off_worker_keeps_pages_until_release() -> None:
    batcher = make_batcher(hand_off=True)
    req = make_request(1, 100, steps=(4,))
    batcher.add_prefill(req)
    out = batcher.complete(batcher.next_microbatch(0.0), 1.0)
    assert out.handoffs == (req,) and not batcher.has_work
    assert batcher.pool.holds(1)
    batcher.release(req)
    assert batcher.pool.num_used == 0


def seated(batcher_steps: list[tuple[int, ...]], budget: int = 1024, pages: int = 100_000) -> tuple:
    batcher = make_batcher(budget, pages=pages)
    for i, steps in enumerate(batcher_steps):
        req = make_request(i, 64, steps=steps)
        batcher.pool.allocate(req.id, req.pages)
        req.step = 1
        batcher.add_decode(req)
    return batcher, batcher.next_microbatch(0.0)


def test_a_run_lasts_until_the_first_block_ends() -> None:
    batcher, mb = seated([(5,), (3,), (9,)])
    assert mb.repeats == 2  # 2 forwards left on request 1
    out = batcher.complete(mb, 2.0, forwards=2)
    assert [r.id for r in out.finished] == [1]


def test_a_run_stops_when_the_head_prefill_fits_the_growing_budget() -> None:
    batcher, _ = seated([(30,)] * 8, budget=1024)  # D = 256: the budget grows 768 per iteration
    batcher.add_prefill(make_request(99, 2000, arrival=5.0))
    mb = batcher.next_microbatch(1.0)
    assert mb.prefills == () and mb.deficit_after == 768
    assert mb.repeats == 2  # the third iteration has 2304 >= 2000: admitted
    assert [r.deficit_after for r in batcher.repeated(mb, 2)] == [768, 1536]
    batcher.complete(mb, 2.0, forwards=2)
    assert batcher.deficit == 1536
    assert batcher.next_microbatch(3.0).prefills != ()


def test_a_run_under_a_memory_stall_banks_no_budget() -> None:
    batcher, _ = seated([(6,)] * 2, budget=1024, pages=12)  # 8 pages held, 4 free
    batcher.add_prefill(make_request(99, 16 * 5, arrival=5.0))  # 5 pages: no room until a block ends
    mb = batcher.next_microbatch(1.0)
    assert mb.memory_blocked and mb.deficit_after == 0
    assert mb.repeats == 5
    reps = batcher.repeated(mb, 5)[1:]
    assert all(r.memory_blocked and r.deficit_after == 0 for r in reps)


def test_a_microbatch_with_prefills_never_repeats() -> None:
    batcher = make_batcher()
    batcher.add_prefill(make_request(1, 100, steps=(5,)))
    assert batcher.next_microbatch(0.0).repeats == 1
