"""Recovery from lost workers: the router's books, the batcher's drops, the simulator's failures."""

from __future__ import annotations

import random
from typing import Any

import pytest
from factories import make_batcher, make_request
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim import LinearCost, check_causal, random_requests, rows, run_cluster

from sangam.batcher import Outcome
from sangam.budget import BatchConfig, Policy
from sangam.faults import Failure, parse_failures
from sangam.layout import Kind, Role, parse_mode
from sangam.request import Request
from sangam.restarts import RestartPolicy, Restarts
from sangam.router import Dispatch, Drop, Fail, Router, Transfer
from sim.cluster import Cluster, ClusterConfig, LinkSpec


def router(mode: str, pages: int = 1000, seed: int = 0, policy: Policy = Policy.DEFICIT) -> Router:
    return Router(parse_mode(mode), pages, random.Random(seed), 8192, policy=policy)


def prefilled(*reqs: Request, handoff: bool = False) -> Outcome:
    for req in reqs:
        req.step = 1
    return Outcome(reqs, reqs if handoff else (), ())


def test_a_lost_colocated_worker_sends_its_queue_and_decodes_to_the_others() -> None:
    r = router("2C")
    a = make_request(1, 100, arrival=0.0, steps=(8, 1))
    b = make_request(2, 200, arrival=0.1, steps=(8,))
    c = make_request(3, 50, arrival=0.2, steps=(8,))
    (da,) = r.on_arrival(0.0, a)
    lost = da.worker
    (db,) = r.on_arrival(0.1, b)
    assert db.worker != lost
    assert r.on_arrival(0.2, c) == [Dispatch(c, lost)]  # 100 outstanding beats 200
    r.on_iteration(1.0, lost, prefilled(a))
    a.step = 5  # a decoded 4 forwards there; c is still queued
    assert (r.forwards_at_risk(lost), r.forwards_at_risk(db.worker)) == (5, 0)  # b is not prefilled yet
    ready = a.record.ready
    assert r.on_worker_lost(2.0, lost) == [Dispatch(a, db.worker), Dispatch(c, db.worker)]  # arrival order
    assert a.block == 0 and a.step == 0 and a.record.ready == ready and a.record.dispatch == 2.0
    assert a.blocks == [a.record] and a.record.prefill_start is None
    assert r.outstanding[lost] == 0 and r.outstanding[db.worker] == 350
    assert (r.workers_lost, r.requests_recovered, r.forwards_redone) == (1, 2, 5)
    assert r.up == [w != lost for w in range(2)]


def test_a_lost_worker_restarts_exactly_the_blocks_it_held() -> None:
    r = router("2C", seed=1)
    a, b = make_request(1, 100, arrival=0.0, steps=(3, 3)), make_request(2, 200, arrival=0.1, steps=(3,))
    (da,) = r.on_arrival(0.0, a)
    (db,) = r.on_arrival(0.1, b)
    assert da.worker != db.worker
    r.on_iteration(1.0, da.worker, prefilled(a))
    a.step = 2
    assert r.on_worker_lost(1.5, db.worker) == [Dispatch(b, da.worker)]  # b was queued there
    assert (r.requests_recovered, r.forwards_redone) == (1, 0) and a.step == 2
    assert r.outstanding == [200 if w == da.worker else 0 for w in range(2)]
    assert r.on_worker_joined(2.0, db.worker) == []
    c = make_request(3, 100, arrival=2.1)
    assert r.on_arrival(2.1, c) == [Dispatch(c, db.worker)]  # the fresh worker is the least loaded


def test_losing_the_source_of_a_transfer_drops_the_reservation_at_the_destination() -> None:
    r = router("2P1D", pages=100)
    a = make_request(1, 16 * 10, arrival=0.0, steps=(3,))
    (d,) = r.on_arrival(0.0, a)
    src, spare = d.worker, 1 - d.worker
    assert r.on_iteration(1.0, src, prefilled(a, handoff=True)) == [Transfer(a, src, 2)]
    assert r.free == [90 if w != spare else 100 for w in range(2)] + [90]
    assert r.on_worker_lost(1.2, src) == [Drop(a, 2), Dispatch(a, spare)]
    assert r.free[2] == 100 and r.free[spare] == 90 and a.record.transfer_start is None


def test_losing_the_destination_of_a_transfer_drops_the_kv_at_the_source() -> None:
    r = router("1P2D", pages=100, seed=3)
    a = make_request(1, 16 * 10, arrival=0.0, steps=(3,))
    r.on_arrival(0.0, a)
    (t,) = r.on_iteration(1.0, 0, prefilled(a, handoff=True))
    assert isinstance(t, Transfer)
    assert r.forwards_at_risk(0) == r.forwards_at_risk(t.dst) == 1  # moving: both ends hold it
    assert r.on_worker_lost(1.2, t.dst) == [Drop(a, 0), Dispatch(a, 0)]
    assert r.free[0] == 90 and r.free[t.dst] == 100 and r.forwards_redone == 1


def test_a_handed_off_block_on_a_lost_prefill_worker_leaves_the_decode_queue() -> None:
    r = router("2P1D", pages=10)
    a, b = make_request(1, 16 * 8, arrival=0.0, steps=(3,)), make_request(2, 16 * 8, arrival=0.1, steps=(3,))
    (da,) = r.on_arrival(0.0, a)
    (db,) = r.on_arrival(0.1, b)
    (ta,) = r.on_iteration(1.0, da.worker, prefilled(a, handoff=True))
    assert ta == Transfer(a, da.worker, 2)
    assert r.on_iteration(1.0, db.worker, prefilled(b, handoff=True)) == []  # no decode pages for b
    assert r.num_decode_ready == 1
    # each prefill worker risks its own block's prefill; a's, moving, is at risk at worker 2 as well
    assert [r.forwards_at_risk(w) for w in (da.worker, db.worker, 2)] == [1, 1, 1]
    assert r.on_worker_lost(1.1, db.worker) == []  # b goes back, and waits: da's worker has a's KV
    assert r.forwards_redone == 1 and r.forwards_at_risk(db.worker) == 0
    assert r.num_decode_ready == 0 and r.num_pending == 1 and r.free[db.worker] == 10


@pytest.mark.parametrize(("mode", "lost", "reason"), [
    ("1C", 0, "worker 0 was lost and 1C has no worker left"),
    ("1P1D", 1, "worker 1 was lost and 1P1D has no decode worker left"),
    ("1P1D", 0, "worker 0 was lost and 1P1D has no prefill worker left"),
    ("1P1C", 1, "worker 1 was lost and 1P1C has no colocated worker left"),
])  # fmt: skip
def test_a_layout_that_can_no_longer_serve_fails_every_request(mode: str, lost: int, reason: str) -> None:
    r = router(mode, pages=100)
    a, b = make_request(1, 16 * 4, arrival=0.0, steps=(3,)), make_request(2, 16 * 4, arrival=0.1, steps=(3,))
    r.on_arrival(0.0, a)
    r.on_arrival(0.1, b)
    actions = r.on_worker_lost(1.0, lost)
    fails = [x for x in actions if isinstance(x, Fail)]
    drops = [x for x in actions if isinstance(x, Drop)]
    assert [f.req for f in fails] == [a, b] and all(f.reason == reason for f in fails)
    assert all(d.worker != lost for d in drops) and a.error == reason
    assert not r.can_serve and r.requests_failed == 2 and r.requests_recovered == 0
    assert r.free == [100] * len(r.free) and r.outstanding == [0] * len(r.free)


def test_a_hybrid_without_prefill_workers_still_serves_by_overflow() -> None:
    r = router("1P1C")
    a = make_request(1, 100, arrival=0.0, steps=(3,))
    r.on_arrival(0.0, a)
    assert r.on_worker_lost(0.5, 0) == [Dispatch(a, 1)] and a.record.overflow


def test_fastdllm_a_request_holding_a_lost_worker_claims_another() -> None:
    r = router("2C", policy=Policy.FASTDLLM)
    a, b = make_request(1, 100, arrival=0.0, steps=(1, 1)), make_request(2, 100, arrival=0.1, steps=(1,))
    (da,) = r.on_arrival(0.0, a)
    (db,) = r.on_arrival(0.1, b)
    a.end_block(1.0)
    assert r.on_iteration(1.0, da.worker, Outcome((a,), (), (a,))) == [Dispatch(a, da.worker)]
    assert r.on_worker_lost(1.1, da.worker) == []  # b holds the other worker
    b.end_block(2.0)
    assert r.on_iteration(2.0, db.worker, Outcome((b,), (), (b,))) == [Dispatch(a, db.worker)]
    assert r.holder[db.worker] == a.id


def test_losing_a_worker_twice_or_rejoining_one_that_is_up_is_refused() -> None:
    r = router("2C")
    r.on_worker_lost(0.0, 1)
    with pytest.raises(ValueError, match="already lost"):
        r.on_worker_lost(0.1, 1)
    with pytest.raises(ValueError, match="has not been lost"):
        r.on_worker_joined(0.2, 0)


# ---- the batcher ---------------------------------------------------------------------------------------


def test_a_dropped_prefill_in_flight_is_left_out_and_its_pages_freed() -> None:
    batcher = make_batcher()
    a, b = make_request(1, 100, arrival=0.0, steps=(4,)), make_request(2, 100, arrival=1.0, steps=(4,))
    batcher.add_prefill(a)
    batcher.add_prefill(b)
    mb = batcher.next_microbatch(0.0)
    assert mb.prefills == (a, b)
    batcher.drop(a)
    assert not batcher.pool.holds(a.id)
    out = batcher.complete(mb, 1.0)
    assert out.prefilled == (b,) and a.step == 0 and a.record.prefill_end is None
    assert batcher.next_microbatch(1.0).decodes == (b,)


def test_dropped_waiting_and_seated_requests_leave_no_trace() -> None:
    batcher = make_batcher()
    a, b, c = (make_request(i, 100, arrival=float(i), steps=(4,)) for i in range(3))
    batcher.add_prefill(a)
    batcher.complete(batcher.next_microbatch(0.0), 1.0)  # a decodes now
    batcher.add_prefill(b)
    batcher.add_prefill(c)
    batcher.drop(b)
    batcher.drop(a)
    mb = batcher.next_microbatch(1.0)
    assert mb.decodes == () and mb.prefills == (c,) and batcher.pool.num_used == c.pages
    out = batcher.complete(mb, 2.0)
    assert out.prefilled == (c,) and a.step == 1


def test_a_request_dropped_then_queued_again_runs_in_the_next_microbatch() -> None:
    batcher = make_batcher()
    a = make_request(1, 100, steps=(4,))
    batcher.add_prefill(a)
    mb = batcher.next_microbatch(0.0)
    batcher.drop(a)
    a.step = 0
    batcher.add_prefill(a)  # routed back here while the old attempt was in flight
    assert batcher.complete(mb, 1.0).prefilled == ()
    again = batcher.next_microbatch(1.0)
    assert again.prefills == (a,) and batcher.complete(again, 2.0).prefilled == (a,)


# ---- parsing -------------------------------------------------------------------------------------------


def test_failures_parse() -> None:
    assert parse_failures("1@30,2@45.5") == [Failure(1, 30.0), Failure(2, 45.5)]
    assert parse_failures(" 0@0 ") == [Failure(0, 0.0)]


@pytest.mark.parametrize(("text", "message"), [
    ("", "use W@T"), ("1", "use W@T"), ("1@", "use W@T"), ("1@2@3", "use W@T"), ("1@30,", "use W@T"),
    ("x@3", "integer worker id"), ("1.5@3", "integer worker id"), ("1@soon", "integer worker id"),
    ("-1@3", "non-negative"), ("1@-2", "non-negative"), ("1@inf", "non-negative"), ("1@nan", "non-negative"),
])  # fmt: skip
def test_bad_failures_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_failures(text)
    assert "\n" not in str(err.value)


# ---- the simulator -------------------------------------------------------------------------------------


def test_a_lost_worker_s_iteration_in_flight_is_redone_on_the_other() -> None:
    a, b = make_request(1, 100, arrival=0.0, steps=(4,)), make_request(2, 100, arrival=0.0, steps=(4,))
    cluster = run_cluster([a, b], "2C", failures=[Failure(0, 2.5)], restart_after_s=1.0)
    victim, other = (a, b) if a.blocks[0].prefill_worker == 1 and a.blocks[0].dispatch == 2.5 else (b, a)
    # both prefill at 0-1 and decode at 1-2; worker 0 dies during its 2-3 decode, and its request
    # (prefill and one decode done: 2 forwards) joins worker 1's next iteration at 3 as a prefill
    assert (other.blocks[0].prefill_start, other.blocks[0].end) == (0.0, 4.0)
    rec = victim.blocks[0]
    assert (rec.ready, rec.dispatch, rec.prefill_worker, rec.prefill_start, rec.end) == (
        0.0,
        2.5,
        1,
        3.0,
        7.0,
    )
    assert len(victim.blocks) == 1 and victim.finished and other.finished
    log = [(r["worker"], r["start"], r["end"], r["n_decodes"], r["n_prefills"]) for r in rows(cluster)]
    assert [row for row in log if row[0] == 0] == [(0, 0.0, 1.0, 0, 1), (0, 1.0, 2.0, 1, 0)]
    assert (1, 3.0, 4.0, 1, 1) in log
    r = cluster.router
    assert (r.workers_lost, r.requests_recovered, r.forwards_redone, r.requests_failed) == (1, 1, 2, 0)
    assert r.up == [True, True]  # back at 4.5: a back-off of 1 s, a start-up of 1 s


def test_a_lost_transfer_source_voids_the_transfer_in_flight() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(3,))
    cluster = run_cluster([a], "1P2D", link=LinkSpec(1e12, 0.5), failures=[Failure(1, 1.2)], seed=2)
    # prefill 0-1 on worker 0, KV on the link to worker 1 or 2 from 1 to 1.5; if it was worker 1,
    # the transfer is void and the block starts again
    rec = a.blocks[0]
    if rec.dispatch == 1.2:
        assert (rec.prefill_start, rec.prefill_end, rec.transfer_start, rec.decode_worker) == (
            1.2,
            2.2,
            2.2,
            2,
        )
        assert rec.end == 2.7 + 2.0
    else:
        assert rec.end == 3.5
    assert cluster.workers[0].batcher.pool.num_used == 0 and cluster.workers[2].batcher.pool.num_used == 0


def test_a_dead_cluster_fails_what_it_holds_and_what_arrives_later() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(4,))
    b = make_request(2, 100, arrival=5.0, steps=(4,))
    cluster = run_cluster([a, b], "1C", failures=[Failure(0, 2.5)])
    assert a.error == "worker 0 was lost and 1C has no worker left"
    assert b.error == "1C has no worker left and none comes back"
    assert not a.finished and not b.finished and cluster.router.requests_failed == 2


def test_with_a_restart_coming_arrivals_wait_for_it() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(4,))
    b = make_request(2, 100, arrival=3.0, steps=(2,))
    run_cluster([a, b], "1C", failures=[Failure(0, 2.5)], restart_after_s=9.0)  # after the 1 s back-off
    assert a.error is not None and b.error is None
    assert (b.blocks[0].prefill_start, b.blocks[0].end) == (12.5, 14.5)


def watched_cluster(mode: str, requests: list[Request], failures: str, startup_s: float) -> Cluster:
    layout = parse_mode(mode)
    config = ClusterConfig(layout, BatchConfig(), BatchConfig(), 8192, 10_000, 1, LinkSpec(), 0.0)
    router = Router(layout, 10_000, random.Random(0), 8192)
    cluster = Cluster(
        config, LinearCost(), router, None, failures=parse_failures(failures), restart_after_s=startup_s
    )
    cluster.run(requests)
    return cluster


def losses_and_returns(cluster: Cluster) -> list[tuple[float, str, int]]:
    return cluster.worker_events


def test_the_simulator_restarts_a_lost_worker_with_the_live_back_off_and_gives_it_up_at_the_bound() -> None:
    """`sangam.restarts`' defaults, as `sangam live --restart-workers`: 1 s, doubling while the worker's
    processes die within 60 s of their start, then a start-up of 0.5 s; a process up 66 s starts the
    count again; a loss while it is down changes nothing; the 6th loss in a row gives it up."""
    long = make_request(1, 100, arrival=0.0, steps=(32,) * 6)  # keeps the run going past 160 s
    fails = "1@10,1@20,1@22.2,1@30,1@100,1@110,1@120,1@130,1@140,1@160"
    cluster = watched_cluster("2C", [long], fails, startup_s=0.5)
    assert losses_and_returns(cluster) == [
        (10.0, "lost", 1), (11.5, "joined", 1),  # up 10 s: 1 s
        (20.0, "lost", 1), (22.5, "joined", 1),  # up 9 s (from 11): 2 s
        (30.0, "lost", 1), (34.5, "joined", 1),  # 4 s
        (100.0, "lost", 1), (101.5, "joined", 1),  # up 66 s: 1 s again
        (110.0, "lost", 1), (112.5, "joined", 1),
        (120.0, "lost", 1), (124.5, "joined", 1),
        (130.0, "lost", 1), (138.5, "joined", 1),
        (140.0, "lost", 1), (156.5, "joined", 1),  # 16 s: the 5th restart in a row
        (160.0, "lost", 1),
    ]  # fmt: skip
    reason = "gave up restarting it after 5 restarts in a row, each dead within 60 s of its start"
    assert cluster.gave_up == {1: reason} and long.finished and long.error is None
    assert cluster.router.up == [True, False]


def test_arrivals_after_the_last_worker_is_given_up_fail_with_the_reason() -> None:
    first = make_request(1, 100, arrival=0.0, steps=(2,))
    late = make_request(2, 100, arrival=200.0, steps=(2,))
    fails = ",".join(f"0@{t}" for t in (10, 20, 30, 50, 80, 130))  # each 8 s or more after its start
    cluster = watched_cluster("1C", [first, late], fails, startup_s=0.0)
    assert [t for t, what, _ in losses_and_returns(cluster) if what == "joined"] == [11, 22, 34, 58, 96]
    assert first.finished and late.error == (
        "1C has no worker left and none comes back (worker 0: gave up restarting it after 5 restarts in "
        "a row, each dead within 60 s of its start)"
    )


def test_simulate_reports_recovery_in_the_summary() -> None:
    from runs.config import RunConfig, synthetic_rows
    from sim.run import simulate

    cfg = RunConfig(mode="2C", qps=20.0, num_requests=200, seed=1, pages=10_000)
    result = simulate(cfg, synthetic_rows(cfg), LinearCost(0.01, 1e-5), failures=[Failure(0, 2.0)])
    s = result.summary
    assert s["workers_lost"] == 1 and s["requests_recovered"] > 0 and s["forwards_redone"] > 0
    assert "requests_failed" not in s and s["failed"] == 0 and s["completed"] == 200
    plain = simulate(cfg, synthetic_rows(cfg), LinearCost(0.01, 1e-5)).summary
    assert (plain["workers_lost"], plain["requests_recovered"], plain["forwards_redone"]) == (0, 0, 0)


# ---- any survivable set of failures --------------------------------------------------------------------


def spares(mode: str) -> list[int]:
    """Workers that may fail without the layout losing a stage: all but one of each pool it needs."""
    layout = parse_mode(mode)
    roles = layout.roles
    prefill = [w for w, role in enumerate(roles) if role is Role.PREFILL]
    decode = [w for w, role in enumerate(roles) if role is not Role.PREFILL]
    keep = {decode[0]} | ({prefill[0]} if layout.kind is Kind.DISAGGREGATED else set())
    return [w for w in range(layout.num_workers) if w not in keep]


@st.composite
def failing_scenarios(draw: Any) -> dict[str, Any]:
    mode = draw(st.sampled_from(["2C", "3C", "1P2D", "2P1D", "2P2D", "1P1C", "2P2C"]))
    max_seq = 400
    may_fail = spares(mode)
    times = st.floats(0.0, 3.0)
    failures = draw(st.lists(st.builds(Failure, st.sampled_from(may_fail), times), min_size=1, max_size=5))
    return {
        "requests": random_requests(draw, draw(st.integers(1, 20)), max_seq),
        "mode": mode,
        "budget": draw(st.integers(32, 1200)),
        "pages": draw(st.integers(max_seq // 16 + 1, 120)),
        "theta": draw(st.integers(1, 3000)),
        "policy": draw(st.sampled_from([Policy.DEFICIT, Policy.DEFICIT, Policy.FASTDLLM])),
        "failures": failures,
        "restart": draw(st.one_of(st.none(), st.floats(0.01, 1.0))),
        "control_s": draw(st.sampled_from([0.0, 0.003])),
    }


@settings(max_examples=80)
@given(failing_scenarios())
def test_survivable_failures_complete_every_request_once_and_balance_every_page(
    scenario: dict[str, Any],
) -> None:
    requests = scenario["requests"]
    cluster = run_cluster(
        requests,
        scenario["mode"],
        cost=LinearCost(0.01, 1e-5),
        budget=scenario["budget"],
        pages=scenario["pages"],
        theta=scenario["theta"],
        link=LinkSpec(50.0, 0.001),
        control_s=scenario["control_s"],
        policy=scenario["policy"],
        failures=scenario["failures"],
        restart_after_s=scenario["restart"],
    )
    for req in requests:
        assert req.error is None and req.finished
        assert req.block == req.n_blocks == len(req.blocks)  # every block ended exactly once
        check_causal(req)
    r = cluster.router
    for w, worker in enumerate(cluster.workers):
        if worker.alive:
            assert worker.batcher.pool.num_used == 0 and not worker.batcher.has_work
            assert r.free[w] == scenario["pages"] and r.outstanding[w] == 0
    assert r.num_pending == 0 and r.num_decode_ready == 0 and not r._books
    assert all(holder is None for holder in r.holder) and r.requests_failed == 0
    assert not cluster._moving and not cluster._controlled


def test_a_dispatch_in_its_control_delay_to_a_lost_worker_is_void_even_after_a_restart() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(3,))
    cluster = run_cluster(
        [a], "1P1C", control_s=1.25, failures=[Failure(0, 0.1)], restart_after_s=0.05, theta=10_000
    )
    # a's prefill is on its way to worker 0 when it is lost at 0.1; without a prefill worker the hybrid
    # overflows a to worker 1. Worker 0 is back at 1.15 (a back-off of 1 s), before the first dispatch
    # would have landed (1.25).
    rec = a.blocks[0]
    assert (rec.dispatch, rec.prefill_worker, rec.overflow, rec.prefill_start, rec.end) == (
        0.1,
        1,
        True,
        1.35,
        4.35,
    )
    assert cluster.router.up == [True, True]
    assert [r["worker"] for r in rows(cluster)] == [1, 1, 1]


def test_fastdllm_a_holder_s_next_block_does_not_wait_behind_an_older_request_without_a_worker() -> None:
    r = router("2C", policy=Policy.FASTDLLM)
    b, a = make_request(1, 100, arrival=0.0, steps=(1, 1)), make_request(2, 100, arrival=0.1, steps=(1, 1))
    (db,) = r.on_arrival(0.0, b)
    (da,) = r.on_arrival(0.1, a)
    b.end_block(1.0)
    assert r.on_iteration(1.0, db.worker, Outcome((b,), (), (b,))) == [Dispatch(b, db.worker)]
    assert r.on_worker_lost(1.1, db.worker) == []  # b is older than a, and has no worker now
    a.end_block(1.2)
    assert r.on_iteration(1.2, da.worker, Outcome((a,), (), (a,))) == [Dispatch(a, da.worker)]
    a.end_block(1.5)
    assert r.on_iteration(1.5, da.worker, Outcome((a,), (), (a,))) == [Dispatch(b, da.worker)]


def test_restarts_back_off_exponentially_and_give_up_after_the_limit() -> None:
    restarts = Restarts(RestartPolicy(limit=4, first_s=1.0, factor=2.0, max_s=5.0, stable_s=60.0))
    waits = [restarts.on_exit(1, uptime=100.0)] + [restarts.on_exit(1, uptime=0.5) for _ in range(4)]
    assert waits == [1.0, 2.0, 4.0, 5.0, None]  # doubled, capped, then given up
    assert "after 4 restarts in a row" in restarts.gave_up(1)
    assert restarts.on_exit(0, uptime=0.5) == 1.0  # each worker has its own count
    assert restarts.on_exit(1, uptime=60.0) == 1.0  # a process that stayed up starts the count again
    assert Restarts(RestartPolicy(limit=0)).on_exit(0, uptime=100.0) is None  # --restart-limit 0: never
    with pytest.raises(ValueError):
        RestartPolicy(limit=-1)
