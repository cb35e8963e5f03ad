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

Recovery: the router keeps each placed block's books (stage, worker, transfer destination),
so that when a worker is lost every request it held goes back to routing at its current
block, which restarts from its prefill (only token ids of ended blocks persist, so that
loses nothing else), and the other end of its work is told to `Drop` it. A layout left
without a worker for some stage (no colocated worker; no prefill or no decode worker of
`<n>P<m>D`; no decode-role worker of `<n>P<m>C`) cannot serve: its requests end with `Fail`.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from sangam.batcher import Outcome
from sangam.budget import Policy
from sangam.layout import Kind, Layout, Role
from sangam.request import BlockRecord, Request


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


@dataclass(slots=True)  # not frozen (frozen init is slow); never mutated
class Drop:
    """Forget `req` on `worker`: its queued or running work and its KV pages there (the other end of
    work that a lost worker took part in; the request has gone back to routing)."""

    req: Request
    worker: int


@dataclass(slots=True)  # not frozen (frozen init is slow); never mutated
class Fail:
    """`req` cannot be served any more: it ends with status ERROR and this one-line reason."""

    req: Request
    reason: str


Action = Dispatch | Transfer  # what arrivals, iterations and transfers lead to
Recovery = Drop | Fail  # what only a lost worker (or a driver giving up) leads to


class _Stage(IntEnum):
    """Where a placed block is, for the books a lost worker must leave."""

    DISPATCHED = 0  # queued or prefilling on `worker`: outstanding tokens (and tallied pages) there
    PREFILLED = 1  # decoding on `worker`, where it prefilled
    HANDED = 2  # prefilled on `worker`, KV held there, waiting for decode pages
    MOVING = 3  # KV moving from `worker` to `dst`: pages held at both ends
    DECODING = 4  # decoding on `worker`, where its KV was moved


# the stages as module names: reading a member off its Enum class calls a descriptor (Python 3.11),
# and the books are written for every block
_DISPATCHED, _PREFILLED, _HANDED, _MOVING, _DECODING = _Stage


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
        self.pages = pages
        self.theta = theta
        self.rng = rng
        self._tallies_pages = layout.kind is not Kind.COLOCATED  # colocated workers manage their own
        roles = layout.roles
        self.outstanding = [0] * len(roles)
        self.free = [pages] * len(roles)
        self.prefill_pool = [w for w, role in enumerate(roles) if role is Role.PREFILL]
        self.decode_pool = [w for w, role in enumerate(roles) if role is not Role.PREFILL]
        self._pending: list[tuple[float, int, Request]] = []  # blocks waiting for a prefill worker
        self._returning: list[tuple[float, int, Request]] = []  # exclusive: next blocks of held requests
        self._decode_ready: list[tuple[float, int, Request, int]] = []  # prefilled, waiting for decode pages
        self.exclusive = policy is Policy.FASTDLLM  # a decode-role worker serves one request at a time
        self.holder: list[int | None] = [None] * len(roles)  # exclusive: the request id holding each worker
        self._held: dict[int, int] = {}  # exclusive: request id -> the worker it holds
        self._books: dict[
            int, tuple[Request, _Stage, int, int]
        ] = {}  # request id -> block, stage, worker, dst
        self.up = [True] * len(roles)  # the pools above hold only workers that are up
        self._serving = True  # every stage of the layout has a worker up
        self.workers_lost = 0
        self.forwards_redone = 0  # forwards of restarted blocks that had already run
        self.requests_failed = 0
        self._recovered: set[int] = set()  # requests a lost worker sent back to routing
        # where a block's prefill goes under this layout (docs/design.md section 2), and whether a
        # prefill placed on each worker is an overflow (a decode-role worker of a hybrid layout)
        self._prefill_target = {
            Kind.COLOCATED: self._colocated_target,
            Kind.DISAGGREGATED: self._disaggregated_target,
            Kind.HYBRID: self._hybrid_target,
        }[layout.kind]
        self._overflows = [layout.kind is Kind.HYBRID and role is not Role.PREFILL for role in roles]

    @property
    def can_serve(self) -> bool:
        return self._serving

    @property
    def requests_recovered(self) -> int:
        return len(self._recovered)

    @property
    def missing(self) -> str:
        """What the layout lacks to serve a request, as a phrase; empty if nothing."""
        return self._missing()

    @property
    def num_pending(self) -> int:
        return len(self._pending) + len(self._returning)

    @property
    def num_decode_ready(self) -> int:
        return len(self._decode_ready)

    def on_arrival(self, now: float, req: Request) -> list[Action]:
        """A new request: route its first block."""
        heapq.heappush(self._pending, (req.arrival, req.id, req))
        return self._drain(now)

    def on_iteration(self, now: float, worker: int, outcome: Outcome) -> list[Action]:
        """Worker `worker` finished an iteration: release charges, route what comes next."""
        books = self._books
        for req in outcome.prefilled:
            self.outstanding[worker] -= req.seq_len
            books[req.id] = (req, _PREFILLED, worker, -1)
        for req in outcome.handoffs:
            heapq.heappush(self._decode_ready, (req.arrival, req.id, req, worker))
            books[req.id] = (req, _HANDED, worker, -1)
        for req in outcome.finished:
            del books[req.id]
            if self._tallies_pages:
                self.free[worker] += req.pages
            if not req.finished:
                self._queue(req)
            elif self.exclusive:
                self._unhold(req.id)
        return self._drain(now)

    def on_transfer_done(self, now: float, req: Request, src: int) -> list[Action]:
        """`req`'s KV has left `src`, whose pages are free again."""
        self.free[src] += req.pages
        books = self._books.get(req.id)
        if books is not None and books[1] is _MOVING:
            self._books[req.id] = (req, _DECODING, books[3], -1)
        return self._drain(now)

    def on_transfer_failed(self, now: float, req: Request, dst: int) -> list[Action]:
        """`req`'s KV never reached `dst` (the request is given up): its reservation there is void."""
        self.free[dst] += req.pages
        self._books.pop(req.id, None)
        self._unhold(req.id)
        return self._drain(now)

    def on_worker_lost(self, now: float, worker: int) -> list[Action | Recovery]:
        """Worker `worker` is gone with all it held. Each request it held (a queued or running prefill,
        a decode, a KV transfer in or out, under fastdllm the worker itself) goes back to routing at
        its current block, which restarts; the surviving end of that block's work gets a `Drop`.
        If the layout can no longer serve, every unfinished request gets a `Fail` instead."""
        if not self.up[worker]:
            raise ValueError(f"worker {worker} is already lost")
        self._set_up(worker, False)
        self.workers_lost += 1
        held = self._held
        hit = self._held_by(worker)
        if not self._serving:
            hit = list(self._books.values())  # none of them can finish
        out: list[Action | Recovery] = []
        for req, stage, at, dst in sorted(hit, key=lambda b: (b[0].arrival, b[0].id)):
            if self._serving:
                self._recovered.add(req.id)
                self.forwards_redone += req.step
            out += self._recall(req, stage, at, dst, worker)
        for rid in [rid for rid, w in held.items() if w == worker]:  # held between blocks: claim anew
            self._unhold(rid)
        if self._returning:
            back = [e for e in self._returning if e[2].id not in held]
            if back:
                self._returning = [e for e in self._returning if e[2].id in held]
                heapq.heapify(self._returning)
                for entry in back:
                    heapq.heappush(self._pending, entry)
        if not self._serving:
            return [*out, *self.give_up(now, f"worker {worker} was lost and {self._missing()}")]
        return [*out, *self._drain(now)]

    def forwards_at_risk(self, worker: int) -> int:
        """The forwards that the blocks `worker` holds have run: what losing it now would redo (or, where
        the layout could not serve without it, lose with the requests that then fail)."""
        return sum(b[0].step for b in self._held_by(worker))

    def _held_by(self, worker: int) -> list[tuple[Request, _Stage, int, int]]:
        """The books of the blocks that `worker` holds: placed there, moving to or from it, or (under
        fastdllm) of the request holding it."""
        held = self._held
        books = tuple(self._books.values())  # one step: a live status reads this while its core books
        return [b for b in books if worker in (b[2], b[3]) or held.get(b[0].id) == worker]

    def on_worker_joined(self, now: float, worker: int) -> list[Action]:
        """Worker `worker` (lost before) is back, empty: it takes work again."""
        if self.up[worker]:
            raise ValueError(f"worker {worker} has not been lost")
        self.outstanding[worker], self.free[worker] = 0, self.pages
        self._set_up(worker, True)
        return self._drain(now)

    def cancel(self, now: float, req: Request) -> list[Action | Drop]:
        """The client gave `req` up. A waiting block leaves its queue; a placed one's books are undone
        (its outstanding tokens and tallied pages, at both ends of a KV transfer) and every worker that
        holds its work or its KV gets a `Drop`. What the freed load and pages let go follows. A request
        the router does not know (finished, or never routed) changes nothing."""
        queued = (self._pending, self._returning)
        for queue in queued:
            if any(entry[2] is req for entry in queue):
                queue[:] = [entry for entry in queue if entry[2] is not req]
                heapq.heapify(queue)
        books = self._books.pop(req.id, None)
        self._unhold(req.id)
        if books is None:
            return [*self._drain(now)]
        _, stage, at, dst = books
        if stage is _DISPATCHED:
            self.outstanding[at] -= req.seq_len
        if stage is _HANDED:
            self._decode_ready = [e for e in self._decode_ready if e[2] is not req]
            heapq.heapify(self._decode_ready)
        if self._tallies_pages:
            self.free[at] += req.pages
            if stage is _MOVING:
                self.free[dst] += req.pages
        drops: list[Action | Drop] = [Drop(req, w) for w in (at, dst) if w >= 0]
        return [*drops, *self._drain(now)]

    def give_up(self, now: float, reason: str) -> list[Fail]:
        """End every request waiting to be routed with ERROR (a driver that knows no lost worker will
        come back calls this for requests that reach a layout unable to serve)."""
        out = []
        waiting = sorted([*self._pending, *self._returning])
        self._pending, self._returning = [], []
        for _, _, req in waiting:
            req.error = reason
            self._unhold(req.id)
            self.requests_failed += 1
            out.append(Fail(req, reason))
        return out

    def _recall(self, req: Request, stage: _Stage, at: int, dst: int, lost: int) -> list[Drop]:
        """Undo a placed block's books, queue it for routing from its prefill; Drops for survivors."""
        del self._books[req.id]
        if stage is _DISPATCHED:
            self.outstanding[at] -= req.seq_len
        if self._tallies_pages:
            self.free[at] += req.pages
        if stage is _HANDED:
            self._decode_ready = [e for e in self._decode_ready if e[2] is not req]
            heapq.heapify(self._decode_ready)
        drops = [Drop(req, w) for w in (at, dst) if w != lost and w >= 0]
        if stage is _MOVING:
            self.free[dst] += req.pages
        if self._held.get(req.id) == lost:
            self._unhold(req.id)
        req.step = 0
        req.record = req.blocks[-1] = BlockRecord(ready=req.record.ready)
        self._queue(req)
        return drops

    def _queue(self, req: Request) -> None:
        """Queue a block for routing: held requests (exclusive) apart, since they need no new worker
        and must not wait behind a request that does."""
        queue = self._returning if self.exclusive and req.id in self._held else self._pending
        heapq.heappush(queue, (req.arrival, req.id, req))

    def _set_up(self, worker: int, up: bool) -> None:
        self.up[worker] = up
        pool = self.prefill_pool if self.layout.roles[worker] is Role.PREFILL else self.decode_pool
        if up:
            bisect.insort(pool, worker)
        else:
            pool.remove(worker)
        self._serving = not self._missing()

    def _missing(self) -> str:
        """What the layout lacks to serve a request; empty if nothing."""
        kind, name = self.layout.kind, self.layout.name
        if not self.decode_pool:
            role = {Kind.COLOCATED: "", Kind.DISAGGREGATED: "decode ", Kind.HYBRID: "colocated "}[kind]
            return f"{name} has no {role}worker left"
        if kind is Kind.DISAGGREGATED and not self.prefill_pool:
            return f"{name} has no prefill worker left"
        return ""

    def _drain(self, now: float) -> list[Action]:
        """Completed prefills first, then new prefills; each queue strictly head-of-line."""
        if (not self._decode_ready and not self._pending and not self._returning) or not self._serving:
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
            self._books[req.id] = (req, _MOVING, src, dst)
            actions.append(Transfer(req, src, dst))
        if self._returning:
            self._route(self._returning, now, actions)
        self._route(self._pending, now, actions)
        return actions

    def _route(self, queue: list[tuple[float, int, Request]], now: float, actions: list[Action]) -> None:
        """Dispatch `queue`'s blocks in order of arrival while the head finds a prefill worker."""
        outstanding, free, books, overflows = self.outstanding, self.free, self._books, self._overflows
        while queue:
            req = queue[0][2]
            if self.exclusive and req.id not in self._held and not self._claim(req):
                break
            worker = self._prefill_target(req)
            if worker is None:
                break
            heapq.heappop(queue)
            outstanding[worker] += req.seq_len
            if self._tallies_pages:
                free[worker] -= req.pages
            books[req.id] = (req, _DISPATCHED, worker, -1)
            record = req.record
            record.dispatch = now
            record.prefill_worker = worker
            record.overflow = overflows[worker]
            actions.append(Dispatch(req, worker))

    def _colocated_target(self, req: Request) -> int | None:
        """The colocated worker with the fewest outstanding prefill tokens."""
        return self._least_loaded(self._open(req, self.decode_pool) if self.exclusive else self.decode_pool)

    def _disaggregated_target(self, req: Request) -> int | None:
        """The prefill worker with the fewest outstanding prefill tokens that has the pages."""
        return self._least_loaded(self.prefill_pool, req.pages)

    def _hybrid_target(self, req: Request) -> int | None:
        """Algorithm 2: the least-loaded prefill worker under theta with the pages, else an overflow."""
        worker = self._least_loaded(self.prefill_pool, req.pages, self.theta)
        return worker if worker is not None else self._overflow_target(req)

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
        least: int | float = limit  # (a union: mypyc keeps int and float apart)
        ties: list[int] = []  # one loop, not comprehensions: this runs for every block
        for w in workers:
            tokens = load[w]
            if tokens <= least and free[w] >= pages:
                if tokens < least:
                    least, ties = tokens, [w]
                elif ties:  # (no ties yet: `least` is still the limit, which is excluded)
                    ties.append(w)
        if len(ties) == 1:
            return ties[0]
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
