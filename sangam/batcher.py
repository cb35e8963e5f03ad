"""Algorithm 1: the worker-local deficit token-budget batcher.

Every iteration seats the in-flight decodes first (they are never displaced), then admits
whole waiting prefills in their request's original arrival order while each fits

    budget = tau - 32 * decodes + deficit

and free KV pages, stopping at the first that does not. An empty microbatch admits the
head prefill whatever its size (the idle rule). With no prefill waiting the deficit is
cleared; otherwise the leftover budget, if positive, is carried to the next iteration.
A memory stall carries only the previous deficit, less what was spent of it, so waiting
for pages never banks fresh budget.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from sangam.budget import BatchConfig, Policy
from sangam.hardware import BLOCK
from sangam.kv import Pages
from sangam.request import Request


@dataclass(slots=True)  # not frozen: built every simulated iteration, and frozen init is slow
class Microbatch:
    """One iteration's work and the budget arithmetic that chose it; never mutated."""

    decodes: tuple[Request, ...]
    prefills: tuple[Request, ...]
    waiting: int  # prefills waiting when the microbatch was formed
    deficit_before: int
    budget: float  # tau - 32 * decodes + deficit_before
    deficit_after: int
    memory_blocked: bool = False
    repeats: int = 1  # iterations, this one first, that run the same decodes if no new work arrives

    @property
    def decode_tokens(self) -> int:
        return BLOCK * len(self.decodes)

    @property
    def prefill_tokens(self) -> int:
        return sum(r.seq_len for r in self.prefills)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


@dataclass(slots=True)  # not frozen (frozen init is slow): one per iteration that prefilled or ended a block
class Outcome:
    """What one iteration changed, as the router needs to hear it; never mutated."""

    prefilled: tuple[Request, ...]  # every prefill that ran
    handoffs: tuple[Request, ...]  # prefilled on a hand-off worker, block goes on: move the KV
    finished: tuple[Request, ...]  # blocks that ended; their pages are already free


NOTHING_DONE = Outcome((), (), ())  # only decode steps, and no block ended


P = TypeVar("P", bound=Pages)  # the live worker's PagePool (page ids), the simulator's PageTally (counts)


class Batcher(Generic[P]):
    """The per-worker scheduler; the sim and live drivers call it every iteration.

    `hand_off` marks a prefill-only worker: its prefilled requests leave for a decode
    worker and keep their pages until `release` is called after the KV transfer.
    """

    def __init__(self, worker: int, config: BatchConfig, pool: P, *, hand_off: bool = False) -> None:
        self.worker = worker
        self.config = config
        self.pool = pool
        self.hand_off = hand_off
        self.decodes: tuple[Request, ...] = ()  # seated; replaced, never mutated, so a microbatch shares it
        self.deficit = 0
        self._tau = config.tau
        self._finite = math.isfinite(self._tau)
        self._one_only = config.policy is Policy.FASTDLLM  # one request at a time
        self._cap = 1 if self._one_only else config.max_decodes  # decodes seated at once
        self._waiting: list[tuple[float, int, Request]] = []
        self._ready: deque[Request] = deque()  # prefilled, holding pages, waiting for a decode seat
        self._run_head: tuple[int, bool] | None = None  # head prefill (length, lacks pages) of a run
        self._dropped: set[int] = set()  # ids dropped since the last microbatch was formed

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._ready or self.decodes)

    def add_prefill(self, req: Request) -> None:
        """Queue the current block's prefill, ordered by the request's original arrival."""
        heapq.heappush(self._waiting, (req.arrival, req.id, req))

    def add_decode(self, req: Request) -> None:
        """Take a request whose KV already sits in this worker's pool (after a transfer)."""
        req.record.decode_worker = self.worker
        self._ready.append(req)

    def release(self, req: Request) -> None:
        """Free a handed-off request's pages once its KV has left."""
        self.pool.release(req.id)

    def drop(self, req: Request) -> None:
        """Forget `req` here: its waiting prefill, its decode (seated or not) and its pages. If it is
        in the microbatch in flight, `complete` leaves it out: that work is lost."""
        waiting = self._waiting
        for i, entry in enumerate(waiting):
            if entry[2] is req:
                waiting[i] = waiting[-1]
                waiting.pop()
                heapq.heapify(waiting)
                break
        if req in self._ready:
            self._ready.remove(req)
        if req in self.decodes:
            self.decodes = tuple(r for r in self.decodes if r is not req)
        if self.pool.holds(req.id):
            self.pool.release(req.id)
        self._dropped.add(req.id)

    def next_microbatch(self, now: float) -> Microbatch | None:
        """Form this iteration's microbatch at time `now`; None, changing nothing, if there is no work.

        Its `repeats`: a decode-only microbatch stays unchanged until one of its blocks ends or the
        head prefill fits the growing budget, only the budget arithmetic moving on, so a driver may
        run that many iterations as one step (`complete(mb, now, forwards)`), cut short when work
        arrives. A microbatch with prefills, or an empty one, has `repeats` 1. (One method, not three:
        the simulator calls it for every microbatch.)"""
        if self._dropped:
            self._dropped.clear()
        if self._ready:
            self._seat_ready(now)
        decodes, waiting = self.decodes, self._waiting
        fresh = self._tau - BLOCK * len(decodes)
        before = self.deficit
        budget = fresh + before
        num_waiting = len(waiting)
        blocked = False
        if not waiting or (self._one_only and decodes):
            if not decodes:
                return None
            deficit = self.deficit = 0  # decodes only: the deficit is cleared
            self._run_head = None  # nothing can be admitted while these decodes run
        else:
            pool = self.pool
            admitted: list[Request] = []
            spent = 0
            while waiting and not (self._one_only and admitted):
                req = waiting[0][2]
                # (an empty microbatch takes the head whatever its size: the idle rule)
                if spent + req.seq_len > budget and (decodes or admitted):
                    break
                if not pool.can_allocate(req.pages):
                    blocked = True
                    break
                heapq.heappop(waiting)
                pool.allocate(req.id, req.pages)
                req.record.prefill_start = now
                admitted.append(req)
                spent += req.seq_len
            if blocked:
                deficit = self.deficit = int(max(0, before - max(0, spent - fresh)))
            else:
                left = budget - spent
                deficit = self.deficit = int(left) if left > 0 and self._finite else 0
            if admitted or not decodes:
                self._run_head = None
                return Microbatch(decodes, tuple(admitted), num_waiting, before, budget, deficit, blocked)
            head = waiting[0][2]  # left waiting: a run lasts until it fits the budget and the pages
            self._run_head = (head.seq_len, blocked or not pool.can_allocate(head.pages))
        # decodes only: they repeat until the block nearest its end ends (a block needs at most BLOCK
        # forwards), or until the head prefill fits the budget, which grows by `fresh` an iteration from
        # `deficit` (unless it lacks pages: those free only when a block ends)
        repeats = BLOCK
        for req in decodes:
            to_go = req.steps[req.block] - req.step
            if to_go < repeats:
                repeats = to_go
        run_head = self._run_head
        if run_head is not None and not run_head[1] and fresh > 0:
            fits = -(-(run_head[0] - deficit) // int(fresh))  # the first repeat whose budget >= S
            if fits < repeats:
                repeats = fits
        return Microbatch(decodes, (), num_waiting, before, budget, deficit, blocked, repeats)

    def complete(self, mb: Microbatch, now: float, forwards: int = 1) -> Outcome:
        """Apply `forwards` iterations of `mb` (more than one only within `mb.repeats`), the last
        ending at `now`."""
        prefills, decodes = mb.prefills, mb.decodes
        if self._dropped:  # dropped while in flight: their work is lost
            prefills = tuple(r for r in prefills if r.id not in self._dropped)
            decodes = tuple(r for r in decodes if r.id not in self._dropped)
        finished: list[Request] = []
        handoffs: list[Request] = []
        for req in prefills:
            req.record.prefill_end = now
            req.step = 1
            if req.steps[req.block] == 1:
                finished.append(req)
            elif self.hand_off:
                handoffs.append(req)
            else:
                req.record.decode_worker = self.worker
                self._ready.append(req)
        if forwards > 1 and self._run_head is not None:  # without a waiting prefill it stays 0
            self.deficit = self._deficit_after(mb, forwards)
        seated: list[Request] | None = None  # the decodes left seated, once one of them ends
        for req in decodes:  # hot path: inlined rather than a method call per decode
            req.step += forwards
            if req.step >= req.steps[req.block]:
                finished.append(req)
                if seated is None:
                    seated = list(self.decodes)
                seated.remove(req)
        if not finished:
            return Outcome(prefills, tuple(handoffs), ()) if prefills else NOTHING_DONE
        if seated is not None:
            self.decodes = tuple(seated)
        release = self.pool.release
        for req in finished:  # the block ends; its pages are free (docs/design.md section 1)
            release(req.id)
            req.end_block(now)
        return Outcome(prefills, tuple(handoffs), tuple(finished))

    def repeated(self, mb: Microbatch, forwards: int) -> list[Microbatch]:
        """`mb` and the `forwards - 1` iterations that repeat it (see `Microbatch.repeats`)."""
        out = [mb]
        for i, (before, budget, after, blocked) in enumerate(self._repeats(mb, forwards), 1):
            out.append(Microbatch(mb.decodes, (), mb.waiting, before, budget, after, blocked, mb.repeats - i))
        return out

    def _deficit_after(self, mb: Microbatch, forwards: int) -> int:
        """The deficit after `forwards` iterations of `mb`: `repeated(mb, forwards)[-1].deficit_after`
        without the microbatches."""
        after = mb.deficit_after
        for repeat in self._repeats(mb, forwards):
            after = repeat[2]
        return after

    def _repeats(self, mb: Microbatch, forwards: int) -> Iterator[tuple[int, float, int, bool]]:
        """The budget arithmetic (deficit before, budget, deficit after, memory-blocked) of the
        `forwards - 1` iterations that repeat `mb`."""
        fresh = self._tau - mb.decode_tokens
        before = mb.deficit_after
        head = self._run_head
        for _ in range(forwards - 1):
            budget = fresh + before
            if head is None:
                after, blocked = 0, False
            elif head[1] and budget >= head[0]:  # fits the budget, not the pages
                after, blocked = int(max(0, before - max(0, -fresh))), True
            else:
                after, blocked = int(max(budget, 0)), False
            yield before, budget, after, blocked
            before = after

    def _seat_ready(self, now: float) -> None:
        if len(self.decodes) >= self._cap:  # no seat: ready requests wait, the seated tuple stays
            return
        seated = list(self.decodes)
        while self._ready and len(seated) < self._cap:
            req = self._ready.popleft()
            req.record.decode_start = now
            seated.append(req)
        self.decodes = tuple(seated)
