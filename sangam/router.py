"""Central routers: where each block's prefill runs and where its KV goes to decode.

A router is told about arrivals, finished worker iterations and finished KV transfers,
and answers with actions for the driver to carry out. Every block's prefill is routed
afresh, because KV is freed at block end and only token ids persist.

Load signals kept here: `outstanding[w]`, prefill tokens dispatched to worker w and not
yet prefilled; `free[w]`, a central tally of w's free KV pages (pools whose memory the
router manages: the prefill pool, and the decode-role pool that KV transfers land in).

Under the fastdllm policy (a server of batch size 1) a request claims a free decode-role
worker when its first block is routed and holds it until its last block ends: every block
prefills there (colocated) or decodes there (after a prefill-pool prefill), no other
request is placed there, and arrivals wait in FIFO order for a worker to come free. One
colocated worker is then an M/G/1 FIFO queue. (Claiming up front, not at the first KV
transfer, means a prefill worker's pages never wait on a decode worker that waits on them.)
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from sangam.batcher import Outcome, Policy
from sangam.layout import Kind, Layout, Role
from sangam.request import Request


@dataclass(slots=True)  # not frozen (frozen init is slow); never mutated
class Dispatch:
    """Queue the current block's prefill of `req` on `worker`."""

    req: Request
    worker: int


@dataclass(slots=True)  # not frozen (frozen init is slow); never mutated
class Transfer:
    """Move `req`'s KV from `src` to `dst`; pages on `dst` are already reserved."""

    req: Request
    src: int
    dst: int


Action = Dispatch | Transfer


class Router:
    """Routing for one layout: colocated, static disaggregated or hybrid (Algorithm 2)."""

    def __init__(
        self,
        layout: Layout,
        pages: int,
        rng: random.Random,
        theta: int = 8192,
        *,
        policy: Policy = Policy.DEFICIT,
    ) -> None:
        if theta <= 0:
            raise ValueError(f"theta must be a positive number of tokens, got {theta}")
        self.layout = layout
        self.theta = theta
        self.rng = rng
        self._tallies_pages = layout.kind is not Kind.COLOCATED  # colocated workers manage their own
        roles = layout.roles
        self.outstanding = [0] * len(roles)
        self.free = [pages] * len(roles)
        self.prefill_pool = [w for w, role in enumerate(roles) if role is Role.PREFILL]
        self.decode_pool = [w for w, role in enumerate(roles) if role is not Role.PREFILL]
        self._pending: list[tuple[float, int, Request]] = []  # blocks waiting for a prefill worker
        self._decode_ready: list[tuple[float, int, Request, int]] = []  # prefilled, waiting for decode pages
        self.exclusive = policy is Policy.FASTDLLM  # a decode-role worker serves one request at a time
        self.holder: list[int | None] = [None] * len(roles)  # exclusive: the request id holding each worker
        self._held: dict[int, int] = {}  # exclusive: request id -> the worker it holds

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_decode_ready(self) -> int:
        return len(self._decode_ready)

    def on_arrival(self, now: float, req: Request) -> list[Action]:
        """A new request: route its first block."""
        heapq.heappush(self._pending, (req.arrival, req.id, req))
        return self._drain(now)

    def on_iteration(self, now: float, worker: int, outcome: Outcome) -> list[Action]:
        """Worker `worker` finished an iteration: release charges, route what comes next."""
        for req in outcome.prefilled:
            self.outstanding[worker] -= req.seq_len
        for req in outcome.handoffs:
            heapq.heappush(self._decode_ready, (req.arrival, req.id, req, worker))
        for req in outcome.finished:
            if self._tallies_pages:
                self.free[worker] += req.pages
            if not req.finished:
                heapq.heappush(self._pending, (req.arrival, req.id, req))
            elif self.exclusive:
                self._unhold(req.id)
        return self._drain(now)

    def on_transfer_done(self, now: float, req: Request, src: int) -> list[Action]:
        """`req`'s KV has left `src`, whose pages are free again."""
        self.free[src] += req.pages
        return self._drain(now)

    def on_transfer_failed(self, now: float, req: Request, dst: int) -> list[Action]:
        """`req`'s KV never reached `dst` (the request is given up): its reservation there is void."""
        self.free[dst] += req.pages
        return self._drain(now)

    def _drain(self, now: float) -> list[Action]:
        """Completed prefills first, then new prefills; each queue strictly head-of-line."""
        if not self._decode_ready and not self._pending:
            return []
        actions: list[Action] = []
        while self._decode_ready:
            _, _, req, src = self._decode_ready[0]
            dst = self._decode_target(req)
            if dst is None:
                break
            heapq.heappop(self._decode_ready)
            self.free[dst] -= req.pages
            req.record.decode_worker = dst
            actions.append(Transfer(req, src, dst))
        while self._pending:
            req = self._pending[0][2]
            if self.exclusive and req.id not in self._held and not self._claim(req):
                break
            target = self._prefill_target(req)
            if target is None:
                break
            heapq.heappop(self._pending)
            worker, overflow = target
            self._charge(worker, req)
            req.record.dispatch = now
            req.record.prefill_worker = worker
            req.record.overflow = overflow
            actions.append(Dispatch(req, worker))
        return actions

    def _charge(self, worker: int, req: Request) -> None:
        self.outstanding[worker] += req.seq_len
        if self._tallies_pages:
            self.free[worker] -= req.pages

    def _prefill_target(self, req: Request) -> tuple[int, bool] | None:
        """Where the block's prefill goes, and whether that is an overflow."""
        kind = self.layout.kind
        if kind is Kind.COLOCATED:
            worker = self._least_loaded(self._open(req, self.decode_pool))
        else:
            limit = self.theta if kind is Kind.HYBRID else math.inf
            worker = self._least_loaded(self.prefill_pool, req.pages, limit)
        if worker is not None or kind is not Kind.HYBRID:
            return None if worker is None else (worker, False)
        worker = self._overflow_target(req)
        return None if worker is None else (worker, True)

    def _overflow_target(self, req: Request) -> int | None:
        """Algorithm 2's overflow: least-loaded colocated worker under theta whose pages
        fit the request after the decode-ready backlog has been served."""
        backlog = sum(entry[2].pages for entry in self._decode_ready)
        if sum(self.free[w] for w in self.decode_pool) - backlog < req.pages:
            return None
        return self._least_loaded(self._open(req, self.decode_pool), req.pages, self.theta)

    def _decode_target(self, req: Request) -> int | None:
        """The decode-role worker with the most free pages, if the KV fits there."""
        free = self.free
        most, ties = req.pages, []
        for w in self._open(req, self.decode_pool):
            if free[w] > most:
                most, ties = free[w], [w]
            elif free[w] == most:
                ties.append(w)
        return self._tie_break(ties) if ties else None

    def _least_loaded(self, workers: Sequence[int], pages: int = 0, limit: float = math.inf) -> int | None:
        """Of `workers` with `pages` free and fewer than `limit` outstanding prefill tokens, the one
        with the fewest (ties broken at random); None if there is none."""
        free, load = self.free, self.outstanding
        least, ties = limit, []  # one loop, not comprehensions: this runs for every block
        for w in workers:
            tokens = load[w]
            if tokens <= least and free[w] >= pages:
                if tokens < least:
                    least, ties = tokens, [w]
                elif ties:  # (no ties yet: `least` is still the limit, which is excluded)
                    ties.append(w)
        return self._tie_break(ties) if ties else None

    def _open(self, req: Request, workers: list[int]) -> list[int]:
        """Of decode-role `workers`, those `req` may be placed on: all, or the one it holds if exclusive."""
        return [self._held[req.id]] if self.exclusive else workers

    def _claim(self, req: Request) -> bool:
        """Exclusive: give `req` a decode-role worker nobody holds; False if there is none."""
        free = [w for w in self.decode_pool if self.holder[w] is None]
        if not free:
            return False
        worker = self._tie_break(free)
        self.holder[worker] = req.id
        self._held[req.id] = worker
        return True

    def _unhold(self, rid: int) -> None:
        worker = self._held.pop(rid, None)
        if worker is not None:
            self.holder[worker] = None

    def _tie_break(self, workers: list[int]) -> int:
        return workers[0] if len(workers) == 1 else self.rng.choice(workers)
