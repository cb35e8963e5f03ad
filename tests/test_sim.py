"""The SimPy cluster: exact event timelines, invariants on random traces, determinism."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from factories import make_request
from hypothesis import given, settings
from hypothesis import strategies as st

from runs.config import RunConfig, synthetic_rows
from runs.results import ITERATION_COLUMNS
from sangam.batcher import Batcher, Microbatch
from sangam.budget import BatchConfig, Policy
from sangam.cost import LoopCosts, LoopedCostModel
from sangam.faults import Failure
from sangam.layout import Role, parse_mode
from sangam.request import Request
from sangam.router import Router
from sim.cluster import Cluster, ClusterConfig, LinkSpec
from sim.run import simulate


@dataclasses.dataclass(frozen=True)
class LinearCost:
    """Iteration time = base + per-token cost of every query token."""

    base: float = 1.0
    per_token: float = 0.0

    def seconds(self, mb: Microbatch) -> float:
        return self.base + self.per_token * (mb.decode_tokens + mb.prefill_tokens)


def run_cluster(
    requests: list[Request],
    mode: str = "1C",
    *,
    cost: Any = LinearCost(),
    budget: int = 1024,
    prefill_budget: int = 2048,
    pages: int = 10_000,
    theta: int = 8192,
    link: LinkSpec = LinkSpec(1e12, 0.5),
    control_s: float = 0.0,
    seed: int = 0,
    policy: Policy = Policy.DEFICIT,
    failures: Sequence[Failure] = (),
    restart_after_s: float | None = None,
) -> Cluster:
    layout = parse_mode(mode)
    batch, prefill_batch = BatchConfig(policy, budget), BatchConfig(policy, prefill_budget)
    config = ClusterConfig(layout, batch, prefill_batch, theta, pages, 1, link, control_s)
    router = Router(layout, pages, random.Random(seed), theta, policy=policy)
    cluster = Cluster(config, cost, router, [], failures=failures, restart_after_s=restart_after_s)
    cluster.run(requests)
    return cluster


def rows(cluster: Cluster) -> list[dict[str, Any]]:
    assert cluster.log is not None
    return [dict(zip(ITERATION_COLUMNS, row, strict=True)) for row in cluster.log]


def test_colocated_timeline_is_exact() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(2, 1))
    b = make_request(2, 100, arrival=0.5, steps=(3,))
    cluster = run_cluster([a, b])
    got = [(r["start"], r["end"], r["n_decodes"], r["n_prefills"]) for r in rows(cluster)]
    assert got == [(0.0, 1.0, 0, 1), (1.0, 2.0, 1, 1), (2.0, 3.0, 1, 1), (3.0, 4.0, 1, 0)]
    assert [blk.end for blk in a.blocks] == [2.0, 3.0]
    assert a.blocks[1].ready == 2.0 and a.blocks[1].prefill_start == 2.0
    assert b.blocks[0].prefill_start == 1.0 and b.blocks[0].decode_start == 2.0 and b.blocks[0].end == 4.0


def test_disaggregated_timeline_is_exact() -> None:
    req = make_request(1, 100, arrival=0.0, steps=(3,))
    run_cluster([req], "1P1D", link=LinkSpec(1e12, 0.5))
    rec = req.blocks[0]
    assert (rec.prefill_worker, rec.prefill_start, rec.prefill_end) == (0, 0.0, 1.0)
    assert (rec.transfer_start, rec.transfer_end) == (1.0, 1.5)
    assert (rec.decode_worker, rec.decode_start, rec.end) == (1, 1.5, 3.5)


def test_work_arriving_on_a_stretch_boundary_stops_it_there() -> None:
    # with 0.1 s iterations, 2.3000000000000003 - 0.4 is 19 steps by division, but 0.4 + 19 * 0.1 rounds
    # below it: the stretch's remaining wait came out negative and SimPy refused it
    a = make_request(0, 379, arrival=0.4, steps=(26,))
    b = make_request(1, 595, arrival=2.3000000000000003, steps=(8, 6))
    c = make_request(2, 140, arrival=2.5, steps=(3,))
    run_cluster([a, b, c], "2C", cost=LinearCost(0.1))
    assert all(req.finished for req in (a, b, c))
    assert b.blocks[0].prefill_worker == a.blocks[0].decode_worker  # b cut a's stretch on its worker
    assert b.blocks[0].prefill_start == b.arrival  # at the boundary itself, with no gap
    assert a.blocks[0].end == pytest.approx(0.4 + 26 * 0.1)  # a's forwards ran back to back throughout


def test_a_link_carries_one_transfer_at_a_time() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(2,))
    b = make_request(2, 100, arrival=0.0, steps=(2,))
    run_cluster([a, b], "1P1D", prefill_budget=4096, link=LinkSpec(1e12, 0.5))
    assert a.blocks[0].transfer_start == 1.0 and b.blocks[0].transfer_start == 1.5


def test_an_arrival_cuts_a_decode_stretch_short_at_the_iteration_boundary() -> None:
    long = make_request(1, 100, arrival=0.0, steps=(20,))
    late = make_request(2, 100, arrival=5.3, steps=(1,))
    cluster = run_cluster([long, late])
    assert late.blocks[0].prefill_start == 6.0  # the iteration in flight at 5.3 ends at 6.0
    assert long.blocks[0].end == 20.0
    assert len(rows(cluster)) == 20


def test_control_delay_holds_every_dispatch_and_a_busy_worker_starts_without_it() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(2, 1))
    b = make_request(2, 100, arrival=0.5, steps=(3,))
    cluster = run_cluster([a, b], control_s=0.25)
    got = [(r["start"], r["end"], r["n_decodes"], r["n_prefills"]) for r in rows(cluster)]
    # a's prefill waits 0.25 on the idle worker; b's arrives at 0.75, mid-iteration, and joins the next one.
    # a's first block ends at 2.25 with b decoding: its re-prefill, queued at 2.5, misses the next iteration
    assert got == [(0.25, 1.25, 0, 1), (1.25, 2.25, 1, 1), (2.25, 3.25, 1, 0), (3.25, 4.25, 1, 1)]
    assert a.blocks[1].ready == 2.25 and a.blocks[1].dispatch == 2.25 and a.blocks[1].prefill_start == 3.25
    assert b.blocks[0].prefill_start == 1.25 and a.blocks[1].end == b.blocks[0].end == 4.25


def test_fastdllm_keeps_the_worker_through_the_control_delay_at_every_block_boundary() -> None:
    a = make_request(1, 100, arrival=0.0, steps=(2, 1))
    b = make_request(2, 100, arrival=0.5, steps=(3,))
    cluster = run_cluster([a, b], control_s=0.25, policy=Policy.FASTDLLM)
    got = [(r["start"], r["end"], r["n_decodes"], r["n_prefills"]) for r in rows(cluster)]
    # a's re-prefill reaches the worker 0.25 after its first block ends, and the worker waits for it
    # (b has been waiting since 0.5); b is dispatched when a's last block ends at 3.5
    assert got == [
        (0.25, 1.25, 0, 1), (1.25, 2.25, 1, 0), (2.5, 3.5, 0, 1),
        (3.75, 4.75, 0, 1), (4.75, 5.75, 1, 0), (5.75, 6.75, 1, 0),
    ]  # fmt: skip
    assert a.blocks[1].prefill_start == 2.5 and a.blocks[-1].end == 3.5
    assert b.blocks[0].dispatch == 3.5 and b.blocks[0].prefill_start == 3.75 and b.blocks[0].end == 6.75


def batch_means_se(values: list[float], batches: int = 20) -> float:
    """Standard error of the mean of an autocorrelated series, from the spread of `batches` batch means."""
    size = len(values) // batches
    means = [sum(values[i * size : (i + 1) * size]) / size for i in range(batches)]
    mean = sum(means) / batches
    return math.sqrt(sum((m - mean) ** 2 for m in means) / (batches - 1) / batches)


def test_fastdllm_on_one_worker_is_an_mg1_fifo_queue() -> None:
    """Lindley's recursion holds exactly, and the mean wait is Pollaczek-Khinchine's for the run's own
    arrival rate and service times: W = lambda E[S^2] / (2 (1 - rho)).

    The server is the request's from its first dispatch (a prefill starts control_s later) to its last
    block's end, so that span is its service time and dispatch - arrival its wait. Waits of a queue are
    correlated, so the tolerance is 4 standard errors estimated by batch means (20 batches of 200); over
    seeds 0-11 of this setting (rho = 0.48-0.50) the error was within 1.8 of them.
    """
    cfg = RunConfig(mode="1C", policy=Policy.FASTDLLM, qps=0.4, num_requests=4000, seed=0, pages=10_000)
    reqs = sorted(
        simulate(cfg, synthetic_rows(cfg), LinearCost(0.01, 1e-5)).requests, key=lambda r: r.arrival
    )
    ends = [req.blocks[-1].end for req in reqs]
    starts = [req.blocks[0].dispatch for req in reqs]
    assert starts[0] == reqs[0].arrival
    for prev_end, req, start in zip(ends, reqs[1:], starts[1:], strict=False):
        assert start == max(req.arrival, prev_end)  # no request starts before the previous one has ended
    waits = [start - req.arrival for req, start in zip(reqs, starts, strict=True)]
    service = [end - start for start, end in zip(starts, ends, strict=True)]
    n = len(reqs)
    lam = (n - 1) / (reqs[-1].arrival - reqs[0].arrival)
    mean_s, mean_s2 = sum(service) / n, sum(x * x for x in service) / n
    assert 0.4 < lam * mean_s < 0.6  # loaded enough for waits to matter, far enough from saturation
    pk = lam * mean_s2 / (2 * (1 - lam * mean_s))
    assert sum(waits) / n == pytest.approx(pk, abs=4 * batch_means_se(waits))


def test_a_loop_cost_holds_the_worker_per_iteration_per_item_and_per_token() -> None:
    # the reference's worker loop: its report and the rest of its loop (0.25 s, plus 0.125 s per item and
    # 1/1024 s per token of each item's sequence) come after the GPU call (1 s) and before the next iteration
    a = make_request(1, 128, arrival=0.0, steps=(3,))
    b = make_request(2, 256, arrival=0.2, steps=(1,))
    cost = LoopedCostModel(LinearCost(1.0), LoopCosts(0.25, item_s=0.125, token_s=1 / 1024))
    cluster = run_cluster([a, b], cost=cost)
    got = [(r["start"], r["end"], r["n_decodes"], r["n_prefills"]) for r in rows(cluster)]
    # a's prefill: 1 + 0.25 + 0.125 + 128/1024; beside b's prefill: + 2 * 0.125 + 384/1024; a's last alone
    assert got == [(0.0, 1.5, 0, 1), (1.5, 3.375, 1, 1), (3.375, 4.875, 1, 0)]
    assert b.blocks[0].prefill_start == 1.5  # b arrived at 0.2 and waited out a's whole loop


def test_a_capped_loop_charges_no_item_past_its_cap() -> None:
    # our own worker loop, fitted as 0.25 s + 0.125 s per item up to 1 item: a's prefill alone pays one
    # item, beside b's prefill the second item adds nothing
    a = make_request(1, 128, arrival=0.0, steps=(3,))
    b = make_request(2, 256, arrival=0.2, steps=(1,))
    cost = LoopedCostModel(LinearCost(1.0), LoopCosts(0.25, item_s=0.125, items_cap=1))
    got = [(r["start"], r["end"]) for r in rows(run_cluster([a, b], cost=cost))]
    assert got == [(0.0, 1.375), (1.375, 2.75), (2.75, 4.125)]
    with pytest.raises(ValueError, match="items cap must be at least 1"):
        LoopCosts(items_cap=0)


def test_the_handoff_is_part_of_every_transfer_and_the_prefill_worker_goes_on_meanwhile() -> None:
    # as the reference's: its prefill worker's loop hands the send to a thread of its own, so its next
    # prefill starts while the scheduler's trigger and the send of the last one are still under way
    a = make_request(1, 1000, arrival=0.0, steps=(2,))
    b = make_request(2, 1000, arrival=0.0, steps=(2,))
    cost = LoopedCostModel(LinearCost(1.0), LoopCosts(0.5))
    run_cluster([a, b], "1P1D", cost=cost, prefill_budget=1024, link=LinkSpec(1e12, 0.25, handoff_s=2.0))
    ra, rb = a.blocks[0], b.blocks[0]
    assert (ra.prefill_start, ra.prefill_end, rb.prefill_start, rb.prefill_end) == (0.0, 1.5, 1.5, 3.0)
    assert ra.transfer_start == 1.5 and ra.transfer_end == pytest.approx(1.5 + 2.0 + 0.25)
    assert rb.transfer_start == pytest.approx(3.75)  # the link carries a's transfer, handoff included, first
    assert rb.transfer_end == pytest.approx(3.75 + 2.25) and ra.decode_start == ra.transfer_end


def test_a_negative_loop_cost_or_handoff_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        LoopCosts(token_s=-0.1)
    with pytest.raises(ValueError, match=r"0 or more, got 100 GB/s, latency 0\.001 s, handoff -0\.5 s$"):
        LinkSpec(100.0, 0.001, -0.5)
    with pytest.raises(
        ValueError, match=r"a KV link needs a finite bandwidth of 0.001 GB/s or more .* latency nan s"
    ):
        LinkSpec(100.0, math.nan)  # NaN once passed every comparison
    with pytest.raises(
        ValueError, match=r"a KV link needs a finite bandwidth of 0.001 GB/s or more .* latency inf s"
    ):
        LinkSpec(100.0, math.inf)  # a links file may hold Infinity
    with pytest.raises(ValueError, match=r"0\.001 GB/s or more \(slower overflowed a transfer's time\)"):
        LinkSpec(1e-300)


def test_a_negative_control_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        ClusterConfig(parse_mode("1C"), BatchConfig(), BatchConfig(), 8192, 100, 1, LinkSpec(), -0.1)


def random_requests(draw: Any, n: int, max_seq: int) -> list[Request]:
    out, t = [], 0.0
    for i in range(n):
        t += draw(st.floats(0.0, 0.3))
        blocks = draw(st.integers(1, 3))
        steps = tuple(draw(st.lists(st.integers(1, 6), min_size=blocks, max_size=blocks)))
        out.append(make_request(i, draw(st.integers(16, max_seq)), arrival=t, steps=steps))
    return out


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    max_seq = 600
    return {
        "requests": random_requests(draw, draw(st.integers(1, 25)), max_seq),
        "mode": draw(st.sampled_from(["1C", "3C", "1P1D", "2P1D", "1P2C", "2P1C"])),
        "budget": draw(st.integers(32, 1200)),
        "prefill_budget": draw(st.integers(64, 2048)),
        "pages": draw(st.integers(max_seq // 16 + 1, 150)),
        "theta": draw(st.integers(1, 3000)),
        "policy": draw(st.sampled_from([Policy.DEFICIT, Policy.DEFICIT, Policy.FASTDLLM])),
    }


def check_causal(req: Request) -> None:
    prev_end = req.arrival
    for rec in req.blocks:
        assert rec.ready == prev_end
        points = [rec.ready, rec.dispatch, rec.prefill_start, rec.prefill_end]
        if rec.transfer_start is not None:
            points += [rec.transfer_start, rec.transfer_end]
        if rec.decode_start is not None:
            points.append(rec.decode_start)
        points.append(rec.end)
        assert None not in points
        assert points == sorted(points), points
        prev_end = rec.end


def check_exclusive(requests: list[Request], roles: tuple[Role, ...]) -> None:
    """Each request used one decode-role worker, which served nobody else from its first dispatch to its
    end."""
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for req in requests:
        used = {rec.decode_worker for rec in req.blocks if rec.decode_worker is not None}
        used |= {rec.prefill_worker for rec in req.blocks if roles[rec.prefill_worker] is not Role.PREFILL}
        assert len(used) <= 1, (req.id, used)
        for w in used:
            spans[w].append((req.blocks[0].dispatch, req.blocks[-1].end))
    for intervals in spans.values():
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(intervals)), intervals


def check_algorithm1(log: list[dict[str, Any]], tau: float) -> None:
    """Every row obeys Algorithm 1, and the amortised bound holds over every window."""
    deficit = 0
    for row in log:
        assert row["deficit_before"] == deficit
        assert row["budget"] == tau - row["decode_tokens"] + row["deficit_before"]
        if row["waiting_prefills"] == 0:
            assert row["n_prefills"] == 0 and row["deficit_after"] == 0
        elif row["memory_blocked"]:
            spent_of_deficit = max(0, row["prefill_tokens"] - (tau - row["decode_tokens"]))
            assert row["deficit_after"] == max(0, row["deficit_before"] - spent_of_deficit)
        else:
            assert row["deficit_after"] == max(row["budget"] - row["prefill_tokens"], 0)
        idle = row["n_decodes"] == 0 and row["n_prefills"] == 1
        assert row["n_prefills"] == 0 or row["prefill_tokens"] <= row["budget"] or idle
        deficit = row["deficit_after"]
    # windows of iterations in which a prefill waits throughout, idle-rule admissions aside
    segment: list[dict[str, Any]] = []
    for row in [*log, None]:
        breaks = row is None or row["waiting_prefills"] == 0 or row["budget"] < row["prefill_tokens"]
        if not breaks:
            segment.append(row)
            continue
        for i in range(len(segment)):
            admitted = decoded = 0
            for j in range(i, len(segment)):
                admitted += segment[j]["prefill_tokens"]
                decoded += segment[j]["decode_tokens"]
                assert admitted <= (j - i + 1) * tau - decoded + segment[i]["deficit_before"]
        segment = []


@settings(max_examples=60)
@given(scenarios())
def test_random_traces_keep_every_invariant(scenario: dict[str, Any]) -> None:
    requests = scenario["requests"]
    cluster = run_cluster(
        requests,
        scenario["mode"],
        cost=LinearCost(0.01, 1e-5),
        budget=scenario["budget"],
        prefill_budget=scenario["prefill_budget"],
        pages=scenario["pages"],
        theta=scenario["theta"],
        link=LinkSpec(50.0, 0.001),
        policy=scenario["policy"],
    )
    assert all(req.finished for req in requests)
    ends = [rec.end for req in requests for rec in req.blocks]
    assert len(ends) == sum(req.n_blocks for req in requests) and None not in ends
    for req in requests:
        check_causal(req)
    for worker in cluster.workers:
        assert worker.batcher.pool.num_used == 0 and not worker.batcher.has_work
    assert all(free == scenario["pages"] for free in cluster.router.free)
    assert all(o == 0 for o in cluster.router.outstanding)
    assert cluster.router.num_pending == 0 and cluster.router.num_decode_ready == 0
    assert all(holder is None for holder in cluster.router.holder)
    if scenario["policy"] is Policy.FASTDLLM:
        check_exclusive(requests, cluster.config.layout.roles)
    per_worker: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows(cluster):
        per_worker[row["worker"]].append(row)
    roles = cluster.config.layout.roles
    for w, log in per_worker.items():
        tau = scenario["prefill_budget"] if roles[w] is Role.PREFILL else scenario["budget"]
        check_algorithm1(log, tau)


def clone(requests: list[Request]) -> list[Request]:
    return [Request(r.id, r.arrival, r.prompt_len, r.output_len, r.mask_len, r.steps) for r in requests]


def timeline(requests: list[Request]) -> list[tuple[Any, ...]]:
    return [dataclasses.astuple(rec) for req in requests for rec in req.blocks]


@pytest.mark.parametrize("mode", ["4C", "2P2D", "2P2C"])
def test_same_seed_same_result(mode: str) -> None:
    rng = random.Random(3)
    base = [
        make_request(
            i, rng.randint(100, 2000), arrival=i * 0.05, steps=tuple(rng.randint(1, 12) for _ in range(4))
        )
        for i in range(200)
    ]
    cost = LinearCost(0.005, 2e-5)
    first, second = clone(base), clone(base)
    run_cluster(first, mode, cost=cost, theta=2000, seed=5)
    run_cluster(second, mode, cost=cost, theta=2000, seed=5)
    assert timeline(first) == timeline(second)


@pytest.mark.parametrize("mode", ["4C", "2P2D", "2P2C"])
def test_decode_stretches_match_iteration_by_iteration(
    mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from runs.build import build

    if build() == "native":  # native callers never see a patched method: run it on a Python copy
        import os
        import subprocess
        import sys

        from tests.test_native import python_tree

        tree = python_tree(tmp_path)
        shutil.copytree(Path(__file__).parent, tree / "tests")
        test = f"tests/test_sim.py::test_decode_stretches_match_iteration_by_iteration[{mode}]"
        env = os.environ | {"PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], env=env,
                             cwd=tree, capture_output=True, text=True)  # fmt: skip
        assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-3000:]
        return
    rng = random.Random(4)
    base = [
        make_request(
            i, rng.randint(100, 2000), arrival=i * 0.07, steps=tuple(rng.randint(1, 20) for _ in range(3))
        )
        for i in range(150)
    ]
    cost = LinearCost(0.004, 1e-5)
    stretched = clone(base)
    run_cluster(stretched, mode, cost=cost, theta=2000)
    formed = Batcher.next_microbatch

    calls = []

    def one_at_a_time(self: Batcher, now: float) -> Microbatch | None:
        calls.append(now)
        mb = formed(self, now)
        return None if mb is None else dataclasses.replace(mb, repeats=1)

    monkeypatch.setattr(Batcher, "next_microbatch", one_at_a_time)
    stepped = clone(base)
    run_cluster(stepped, mode, cost=cost, theta=2000)
    assert calls  # the patch took
    for a, b in zip(timeline(stretched), timeline(stepped), strict=True):
        assert [x is None for x in a] == [y is None for y in b]
        assert [x for x in a if x is not None] == pytest.approx(
            [y for y in b if y is not None], rel=1e-9, abs=1e-9
        )
