"""The SimPy cluster: a process per worker, KV links, arrivals, around the pure core.

Workers form microbatches with `sangam.batcher.Batcher`, spend the cost model's time,
apply the outcome and tell `sangam.router.Router`, whose actions the cluster carries out.
A decode-only microbatch that would repeat unchanged (until a block ends or the head
prefill fits the growing budget: `Microbatch.repeats`) runs as one timeout; a dispatch or an
arriving decode cuts that stretch short at the end of the iteration in flight, so the
result is the same as stepping every iteration.

Routing is not instantaneous in a live deployment: a block's end reaches the central scheduler in a
report, and its re-prefill reaches a worker in a message, by which time a busy worker has started its
next iteration without it. `control_s` charges that delay to every dispatch.

Failures (`Failure(worker, at)`): the worker stops where it is, so its iteration in flight
is lost, and the router's `on_worker_lost` sends its requests back to routing; `Drop` actions make
the other ends forget their part, `Fail` ends a request. With `restart_after_s` the worker is restarted
as `sangam live --restart-workers` restarts it (`sangam.restarts`: a back-off that doubles while its
processes die young, and a bound after which it is given up) and comes back, empty, `restart_after_s`
after its new process starts (`on_worker_joined`). A dispatch still in its control delay, or a transfer
in flight, that a loss or a drop overtook is void when it would land.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import simpy
from simpy.events import NORMAL, URGENT, EventPriority

from runs.results import iteration_row
from sangam.batcher import NOTHING_DONE, Batcher, Microbatch, Outcome
from sangam.budget import BatchConfig
from sangam.cost import CostModel
from sangam.faults import Failure
from sangam.kv import PageTally
from sangam.layout import Layout, Role
from sangam.request import Request
from sangam.restarts import Restarts
from sangam.router import Action, Dispatch, Drop, Fail, Recovery, Router, Transfer

MIN_GB_PER_S = 1e-3  # as a testbed's link (profiles.testbed)


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A pairwise GPU link: transfer time = handoff + bytes / bandwidth + latency, where the handoff is the
    control plane's part (from a prefill's end to its KV send's start: a testbed's `handoff_ms`)."""

    gb_per_s: float = 100.0  # ASSUMPTION until the live NCCL transfer is measured
    latency_s: float = 0.001
    handoff_s: float = 0.0

    def __post_init__(self) -> None:
        finite = all(map(math.isfinite, (self.gb_per_s, self.latency_s, self.handoff_s)))
        if not (finite and self.gb_per_s >= MIN_GB_PER_S and self.latency_s >= 0 and self.handoff_s >= 0):
            raise ValueError(
                f"a KV link needs a finite bandwidth of {MIN_GB_PER_S:g} GB/s or more (slower overflowed a "
                f"transfer's time), latency and handoff of 0 or more, got "
                f"{self.gb_per_s:g} GB/s, latency {self.latency_s:g} s, handoff {self.handoff_s:g} s"
            )

    def seconds(self, nbytes: int) -> float:
        return self.handoff_s + nbytes / (self.gb_per_s * 1e9) + self.latency_s


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


class _Call:
    """The least an event on SimPy's queue needs (what `Environment.step` reads: its callbacks, and that
    it succeeded): scheduled by `_later`, it calls its callback at its time. The simulator schedules a
    few hundred thousand per run; a full `simpy.Timeout` costs more to build than its use here. Built
    bare and given its callback after (`_Call()`, then `callbacks = [callback]`): an `__init__` of its
    own would add a Python call to every event."""

    __slots__ = ("callbacks",)
    _ok = True
    callbacks: list[Callable[[Any], None]] | None


class _Carrying(_Call):
    """A bare event that carries the action it completes: a dispatch out of its control delay, a KV
    transfer that has landed (one event and no `partial` per block)."""

    __slots__ = ("action",)
    action: Any


def _later(
    env: simpy.Environment, delay: float, callback: Callable[[Any], None], priority: EventPriority = NORMAL
) -> _Call:
    """`callback(event)` `delay` from now, after the events already due then (URGENT: before the
    ordinary ones, as SimPy's process starts and interrupts are); the event."""
    event = _Call()
    event.callbacks = [callback]
    env.schedule(event, priority, delay)  # type: ignore[arg-type]  # a duck-typed event
    return event


class SimWorker:
    """One GPU worker: the Batcher driven by simulated time.

    The worker is a state machine on the event queue rather than a SimPy process (a generator): the
    same outcome, at the same instants and in the same order, as the process it replaces (a start
    event, an idle wake-up, a timeout per microbatch; a decode stretch is cut where the process took an
    interrupt), without a generator resumed or an exception thrown per event."""

    __slots__ = (
        "_end", "_idle", "_in_run", "_landed_call", "_mb", "_run", "_schedule", "_seconds", "_start",
        "_step", "_until", "alive", "batcher", "cluster", "env", "id",
    )  # fmt: skip

    def __init__(self, cluster: Cluster, worker: int, batcher: Batcher) -> None:
        self.cluster = cluster
        self.env = cluster.env
        self.id = worker
        self.batcher = batcher
        self._idle = False  # waiting for work
        self._in_run = False  # inside a multi-iteration decode stretch
        # the microbatch in flight (None: none): its start, the time of one iteration, its iterations,
        # the instant the last ends, and the event then (a cut replaces it: the one replaced is void)
        self._mb: Microbatch | None = None
        self._start = self._step = self._end = 0.0
        self._run = 0
        self._until: _Call | None = None
        self._landed_call = self._landed
        self._seconds = cluster.cost.seconds
        self._schedule = self.env.schedule
        self.alive = True
        _later(self.env, 0, self._resume, URGENT)  # as a process starts

    def wake(self, last: bool = False) -> None:
        """New work for this worker: end an idle wait, or cut a decode stretch short. `last`: the
        caller's event does nothing after this, so where no other event is due now the worker starts
        here, not in a wake-up event of its own (which would be the next event run)."""
        if not self.alive:
            return
        if self._idle:
            self._idle = False
            env = self.env
            if last and env.peek() > env.now:
                self._next(env.now)
            else:
                _later(env, 0, self._resume)
        elif self._in_run:
            self._in_run = False
            self._cut()

    def kill(self) -> None:
        """The worker is lost: it stops where it is, and the iteration in flight with it. Iterations
        of a decode stretch that ended before it still count (no block ends inside one)."""
        self.alive = False
        mb = self._mb
        if mb is not None:
            start, step = self._start, self._step
            done = min(self._run - 1, int((self.env.now - start) / step))
            if done > 0:
                self.batcher.complete(mb, start + done * step, done)
                self.cluster.iterations += done
                if self.cluster.log is not None:
                    self.cluster.log_iterations(self.id, start, step, self.batcher.repeated(mb, done))

    def _resume(self, _: object) -> None:
        """Started, or woken from idle (`_`: the event)."""
        if self.alive:
            self._next(self.env.now)

    def _next(self, start: float) -> None:
        """Form the next microbatch at `start` (now) and wait out its time, or wait for work."""
        mb = self._mb = self.batcher.next_microbatch(start)
        if mb is None:
            self._idle = True
            return
        self._start = start
        self._step = step = self._seconds(mb)
        self._run = run = mb.repeats
        self._in_run = run > 1  # a stretch of `run` iterations, cut short if new work arrives
        self._until = until = _Call()
        until.callbacks = [self._landed_call]
        delay = run * step
        self._end = start + delay  # as SimPy sums it: the instant the event is due
        self._schedule(until, NORMAL, delay)  # type: ignore[arg-type]  # a duck-typed event

    def _cut(self) -> None:
        """`wake` during a decode stretch: stop after the iteration in flight. (Done at once: the
        process this replaces was interrupted by an urgent event at the same instant, which nothing
        else could run before.)"""
        start, step, now = self._start, self._step, self.env.now
        begun = math.ceil((now - start) / step)  # iterations begun by now, the one in flight the last
        if begun < 1:
            begun = 1
        if begun < self._run:
            self._run = begun
        run = self._run
        # work that arrives on a boundary: start + run * step can round a few ulps below now
        delay = max(0.0, start + run * step - now)
        self._end = now + delay
        self._until = until = _Call()
        until.callbacks = [self._landed_call]
        self._schedule(until, NORMAL, delay)  # type: ignore[arg-type]  # a duck-typed event

    def _landed(self, event: object) -> None:
        """The microbatch in flight ended (`event`: its timeout; one a cut replaced is void)."""
        if event is not self._until or not self.alive:
            return
        self._in_run = False
        mb, run, now = self._mb, self._run, self._end
        assert mb is not None
        cluster = self.cluster
        cluster.iterations += run
        if cluster.log is not None:
            cluster.log_iterations(self.id, self._start, self._step, self.batcher.repeated(mb, run))
        outcome = self.batcher.complete(mb, now, run)
        if outcome is not NOTHING_DONE:
            cluster.on_iteration(now, self.id, outcome)
        self._next(now)


class Cluster:
    """Workers, router and links of one simulated deployment."""

    def __init__(
        self,
        config: ClusterConfig,
        cost: CostModel,
        router: Router,
        log: list[tuple] | None,
        *,
        failures: Sequence[Failure] = (),
        restart_after_s: float | None = None,
        on_request: Callable[[int], None] | None = None,
        stop: Callable[[Request, float], bool] | None = None,
    ) -> None:
        """`restart_after_s`: a restarted worker's start-up, from its new process's start (after the
        back-off) to taking work; None: lost workers never come back. `on_request` hears how many
        requests have ended so far, each time some have; `stop(req, now)` is asked after each request's
        end whether to end the run there (`stopped_at` then says when); not with failures, whose
        requests may end without a latency."""
        for failure in failures:
            if failure.worker >= config.layout.num_workers:
                raise ValueError(
                    f"cannot fail worker {failure.worker}: {config.layout.name} has workers 0 to "
                    f"{config.layout.num_workers - 1}"
                )
        if stop is not None and failures:
            raise ValueError("a run that may stop early cannot also lose workers")
        if restart_after_s is not None and not restart_after_s >= 0:
            raise ValueError(f"a restart's start-up cannot be negative, got {restart_after_s}")
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
        self.failures = sorted(failures, key=lambda f: (f.at, f.worker))
        self.restart_after_s = restart_after_s
        self.restarts = Restarts()  # the live launcher's policy, with its defaults
        self.gave_up: dict[int, str] = {}  # workers given up, and why
        self.worker_events: list[tuple[float, str, int]] = []  # (time, "lost" or "joined", worker)
        self._started = [0.0] * n  # when each worker's current process started
        self._restarts = 0  # restarts scheduled and not yet done
        self._controlled: dict[int, Dispatch] = {}  # request id -> its dispatch in the control delay
        self._moving: dict[int, Transfer] = {}  # request id -> its KV transfer in flight
        self._on_request = on_request
        self._stop = stop
        self._counting = on_request is not None or stop is not None
        self._requests_ended = 0
        self.stopped_at: float | None = None

    def _batcher(self, worker: int, role: Role) -> Batcher:
        config = self.config.prefill_batch if role is Role.PREFILL else self.config.batch
        return Batcher(worker, config, PageTally(self.config.pages), hand_off=role is Role.PREFILL)

    def run(self, requests: Sequence[Request]) -> float:
        """Simulate until every request has finished; the simulated end time."""
        self._blocks_left = sum(req.n_blocks for req in requests)
        if requests:
            order = sorted(requests, key=lambda r: (r.arrival, r.id))
            _later(self.env, 0, partial(self._arrivals, order, 0, True), URGENT)  # as a process starts
            for failure in self.failures:
                self.env.timeout(failure.at).callbacks.append(partial(self._lose, failure.worker))
            self.env.run(until=self._all_done)
        return self.env.now

    def _arrivals(self, order: list[Request], i: int, start: bool, _: object) -> None:
        """`order[i]` arrives now, then those after it due by now; an event waits for the next (`start`:
        the first call, before which nothing waited; `_`: the event). A chain of events, not a process:
        the same events at the same instants (the time waited is the arrival minus now)."""
        now = self.env.now
        if start and order[i].arrival > now:
            _later(self.env, order[i].arrival - now, partial(self._arrivals, order, i, False))
            return
        while True:
            self._apply(self.router.on_arrival(now, order[i]))
            if not self.router.can_serve and not self._restarts:  # and no lost worker comes back
                self._apply(self.router.give_up(now, self._none_comes_back()))
            i += 1
            if i == len(order):
                return
            if order[i].arrival > now:
                _later(self.env, order[i].arrival - now, partial(self._arrivals, order, i, False))
                return

    def on_iteration(self, now: float, worker: int, outcome: Outcome) -> None:
        """Tell the router; stop the clock once the last block has ended."""
        self._blocks_left -= len(outcome.finished)
        if self._counting:
            self._ended([req for req in outcome.finished if req.finished])
        actions = self.router.on_iteration(now, worker, outcome)
        if actions:
            self._apply(actions)
        if self._blocks_left == 0:
            self._stop_if_done()

    def _stop_if_done(self) -> None:
        if self._blocks_left == 0 and not self._all_done.triggered:
            self._all_done.succeed()

    def _lose(self, worker: int, _: object) -> None:
        """Failure of `worker` (`_`: its timeout); a worker that is down already stays so."""
        lost = self.workers[worker]
        if not lost.alive:
            return
        lost.kill()
        self.worker_events.append((self.env.now, "lost", worker))
        self._controlled = {rid: d for rid, d in self._controlled.items() if d.worker != worker}
        self._apply(self.router.on_worker_lost(self.env.now, worker))
        if self.restart_after_s is not None:
            now = self.env.now
            wait = self.restarts.on_exit(worker, now - self._started[worker])
            if wait is None:
                self.gave_up[worker] = self.restarts.gave_up(worker)
            else:
                self._restarts += 1
                self._started[worker] = now + wait
                back = wait + self.restart_after_s
                self.env.timeout(back).callbacks.append(partial(self._rejoin, worker))
        self._stop_if_done()

    def _none_comes_back(self) -> str:
        """Why a request that reaches a layout unable to serve fails."""
        why = "; ".join(f"worker {w}: {reason}" for w, reason in sorted(self.gave_up.items()))
        return f"{self.router.missing} and none comes back" + (f" ({why})" if why else "")

    def _rejoin(self, worker: int, _: object) -> None:
        """`worker` restarted (`_`: its timeout): a fresh process with an empty batcher."""
        self._restarts -= 1
        self.workers[worker] = SimWorker(
            self, worker, self._batcher(worker, self.config.layout.roles[worker])
        )
        self.worker_events.append((self.env.now, "joined", worker))
        self._apply(self.router.on_worker_joined(self.env.now, worker))

    def log_iterations(self, worker: int, start: float, step: float, iterations: list[Microbatch]) -> None:
        assert self.log is not None
        for i, mb in enumerate(iterations):
            self.log.append(iteration_row(worker, start + i * step, start + (i + 1) * step, mb))

    def _apply(self, actions: Sequence[Action | Recovery]) -> None:
        control_s = self.config.control_s
        for action in actions:
            if isinstance(action, Dispatch):
                if control_s:
                    self._controlled[action.req.id] = action
                    self._carry(action, control_s, self._dispatch_due)
                else:
                    self._dispatch(action)
            elif isinstance(action, Transfer):
                self._transfer(action)
            elif isinstance(action, Drop):
                self._drop(action)
            else:
                self._fail(action)

    def _carry(self, action: Action, delay: float, callback: Callable[[_Carrying], None]) -> None:
        """`callback(event)` `delay` from now, `event.action` being `action`."""
        event = _Carrying()
        event.action = action
        event.callbacks = [callback]
        self.env.schedule(event, NORMAL, delay)  # type: ignore[arg-type]  # a duck-typed event

    def _dispatch_due(self, event: _Carrying) -> None:
        """A dispatch's control delay is over: queue its prefill, unless a loss or a drop overtook it."""
        action: Dispatch = event.action
        if self._controlled.get(action.req.id) is not action:
            return
        del self._controlled[action.req.id]
        self._dispatch(action, last=True)

    def _dispatch(self, action: Dispatch, last: bool = False) -> None:
        """Queue the prefill on its worker (`last`: as `SimWorker.wake`'s)."""
        target = self.workers[action.worker]
        target.batcher.add_prefill(action.req)
        target.wake(last)

    def _transfer(self, action: Transfer) -> None:
        """Reserve the pages on the destination now; the link carries one transfer at a time."""
        req, now, link_free = action.req, self.env.now, self._link_free[action.src]
        self.workers[action.dst].batcher.pool.allocate(req.id, req.pages)
        start = max(now, link_free[action.dst])
        end = start + self.config.link.seconds(req.seq_len * self.config.kv_bytes_per_token)
        link_free[action.dst] = end
        req.record.transfer_start = start
        req.record.transfer_end = end
        self._moving[req.id] = action
        self._carry(action, end - now, self._transfer_done)

    def _transfer_done(self, event: _Carrying) -> None:
        """A transfer's KV has landed: the request decodes on its destination."""
        action: Transfer = event.action
        if self._moving.get(action.req.id) is not action:
            return  # an end of it was lost on the way
        del self._moving[action.req.id]
        req, dst = action.req, self.workers[action.dst]
        self.workers[action.src].batcher.release(req)
        dst.batcher.add_decode(req)
        dst.wake()
        self._apply(self.router.on_transfer_done(self.env.now, req, action.src))

    def _drop(self, action: Drop) -> None:
        """`action.worker` forgets the request; a dispatch or transfer of it still on its way is void."""
        req, worker = action.req, action.worker
        controlled = self._controlled.get(req.id)
        if controlled is not None and controlled.worker == worker:
            del self._controlled[req.id]
        moving = self._moving.get(req.id)
        if moving is not None and worker in (moving.src, moving.dst):
            del self._moving[req.id]
        self.workers[worker].batcher.drop(req)
        self.workers[worker].wake()  # a decode stretch that counted on it ends after the iteration in flight

    def _fail(self, action: Fail) -> None:
        self._blocks_left -= action.req.n_blocks - action.req.block
        if self._counting:
            self._ended([action.req])
        self._stop_if_done()

    def _ended(self, ended: Sequence[Request]) -> None:
        if not ended:
            return
        self._requests_ended += len(ended)
        if self._on_request is not None:
            self._on_request(self._requests_ended)
        if self._stop is not None and not self._all_done.triggered:
            now = self.env.now
            if any([self._stop(req, now) for req in ended]):  # each told, even after the first True
                self.stopped_at = now
                self._all_done.succeed()
