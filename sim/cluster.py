"""The SimPy cluster: a process per worker, KV links, arrivals, around the pure core.

Workers form microbatches with `sangam.batcher.Batcher`, spend the cost model's time,
apply the outcome and tell `sangam.router.Router`, whose actions the cluster carries out.
A decode-only microbatch that would repeat unchanged (until a block ends or the head
prefill fits the growing budget: `Batcher.run_length`) runs as one timeout; a dispatch or an
arriving decode cuts that stretch short at the end of the iteration in flight, so the
result is the same as stepping every iteration.

Routing is not instantaneous in a live deployment: a block's end reaches the central scheduler in a
report, and its re-prefill reaches a worker in a message, by which time a busy worker has started its
next iteration without it. `control_s` charges that delay to every dispatch.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import simpy

from sangam.batcher import BatchConfig, Batcher, Microbatch, Outcome
from sangam.cost import CostModel
from sangam.kv import PagePool
from sangam.layout import Layout, Role
from sangam.request import Request
from sangam.results import iteration_row
from sangam.router import Action, Dispatch, Router, Transfer


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A pairwise GPU link: transfer time = bytes / bandwidth + latency."""

    gb_per_s: float = 100.0  # ASSUMPTION until the live NCCL transfer is measured
    latency_s: float = 0.001

    def __post_init__(self) -> None:
        if not self.gb_per_s > 0 or self.latency_s < 0:
            raise ValueError(f"a link needs positive bandwidth and non-negative latency, got {self}")

    def seconds(self, nbytes: int) -> float:
        return nbytes / (self.gb_per_s * 1e9) + self.latency_s


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    layout: Layout
    batch: BatchConfig  # colocated and decode-role workers
    prefill_batch: BatchConfig  # prefill-role workers
    theta: int
    pages: int  # KV pages per worker
    kv_bytes_per_token: int
    link: LinkSpec = LinkSpec()
    control_s: float = 0.0  # from a routing decision to the prefill queued on its worker

    def __post_init__(self) -> None:
        if not self.control_s >= 0:
            raise ValueError(f"the control-plane delay must be non-negative, got {self.control_s}")


class SimWorker:
    """One GPU worker: the Batcher driven by simulated time."""

    def __init__(self, cluster: Cluster, worker: int, batcher: Batcher) -> None:
        self.cluster = cluster
        self.env = cluster.env
        self.id = worker
        self.batcher = batcher
        self._idle: simpy.Event | None = None  # set while waiting for work
        self._in_run = False  # inside a multi-iteration decode stretch
        self._process = self.env.process(self._loop())

    def wake(self) -> None:
        """New work for this worker: end an idle wait, or cut a decode stretch short."""
        if self._idle is not None:
            self._idle.succeed()
            self._idle = None
        elif self._in_run:
            self._in_run = False
            self._process.interrupt()

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env, batcher, cluster = self.env, self.batcher, self.cluster
        seconds, timeout, logging = cluster.cost.seconds, env.timeout, cluster.log is not None
        while True:
            if not batcher.has_work:
                self._idle = env.event()
                yield self._idle
                continue
            start = env.now
            mb = batcher.next_microbatch(start)
            step = seconds(mb)
            run = batcher.run_length(mb)
            self._in_run = run > 1  # a stretch of `run` iterations, cut short if new work arrives
            try:
                yield timeout(run * step)
                self._in_run = False
            except simpy.Interrupt:  # `wake` during the stretch: stop after the iteration in flight
                run = min(run, max(1, math.ceil((env.now - start) / step)))
                # work that arrives on a boundary: start + run * step can round a few ulps below now
                yield timeout(max(0.0, start + run * step - env.now))
            cluster.iterations += run
            if logging:
                cluster.log_iterations(self.id, start, step, batcher.repeated(mb, run))
            now = env.now
            outcome = batcher.complete(mb, now, run)
            if outcome.prefilled or outcome.finished:
                cluster.on_iteration(now, self.id, outcome)


class Cluster:
    """Workers, router and links of one simulated deployment."""

    def __init__(
        self, config: ClusterConfig, cost: CostModel, router: Router, log: list[tuple] | None
    ) -> None:
        self.env = simpy.Environment()
        self.config = config
        self.cost = cost
        self.router = router
        self.log = log
        self.workers = [
            SimWorker(self, w, self._batcher(w, role)) for w, role in enumerate(config.layout.roles)
        ]
        n = len(self.workers)
        self._link_free = [[0.0] * n for _ in range(n)]  # [src][dst]: when that directed link is next idle
        self.iterations = 0
        self._blocks_left = 0
        self._all_done = self.env.event()

    def _batcher(self, worker: int, role: Role) -> Batcher:
        config = self.config.prefill_batch if role is Role.PREFILL else self.config.batch
        return Batcher(worker, config, PagePool(self.config.pages), hand_off=role is Role.PREFILL)

    def run(self, requests: Sequence[Request]) -> float:
        """Simulate until every request has finished; the simulated end time."""
        self._blocks_left = sum(req.n_blocks for req in requests)
        if requests:
            self.env.process(self._arrivals(requests))
            self.env.run(until=self._all_done)
        return self.env.now

    def _arrivals(self, requests: Sequence[Request]) -> Generator[simpy.Event, Any, None]:
        for req in sorted(requests, key=lambda r: (r.arrival, r.id)):
            if req.arrival > self.env.now:
                yield self.env.timeout(req.arrival - self.env.now)
            self._apply(self.router.on_arrival(self.env.now, req))

    def on_iteration(self, now: float, worker: int, outcome: Outcome) -> None:
        """Tell the router; stop the clock once the last block has ended."""
        self._blocks_left -= len(outcome.finished)
        self._apply(self.router.on_iteration(now, worker, outcome))
        if self._blocks_left == 0 and not self._all_done.triggered:
            self._all_done.succeed()

    def log_iterations(self, worker: int, start: float, step: float, iterations: list[Microbatch]) -> None:
        assert self.log is not None
        for i, mb in enumerate(iterations):
            self.log.append(iteration_row(worker, start + i * step, start + (i + 1) * step, mb))

    def _apply(self, actions: list[Action]) -> None:
        control_s = self.config.control_s
        for action in actions:
            if not isinstance(action, Dispatch):
                self._transfer(action)
            elif control_s:
                self.env.timeout(control_s).callbacks.append(partial(self._dispatch, action))
            else:
                self._dispatch(action)

    def _dispatch(self, action: Dispatch, _: object = None) -> None:
        """Queue the prefill on its worker (`_`: the control-delay event, when it comes from one)."""
        target = self.workers[action.worker]
        target.batcher.add_prefill(action.req)
        target.wake()

    def _transfer(self, action: Transfer) -> None:
        """Reserve the pages on the destination now; the link carries one transfer at a time."""
        req, now, link_free = action.req, self.env.now, self._link_free[action.src]
        self.workers[action.dst].batcher.pool.allocate(req.id, req.pages)
        start = max(now, link_free[action.dst])
        end = start + self.config.link.seconds(req.seq_len * self.config.kv_bytes_per_token)
        link_free[action.dst] = end
        req.record.transfer_start = start
        req.record.transfer_end = end
        self.env.timeout(end - now).callbacks.append(partial(self._transfer_done, action))

    def _transfer_done(self, action: Transfer, _: object) -> None:
        """The KV has landed (`_`: the transfer's event): the request decodes on its destination."""
        req, dst = action.req, self.workers[action.dst]
        self.workers[action.src].batcher.release(req)
        dst.batcher.add_decode(req)
        dst.wake()
        self._apply(self.router.on_transfer_done(self.env.now, req, action.src))
