"""A live worker process: a gRPC front end and one loop thread that drives `sangam.batcher.Batcher`.

    python -m executor.worker --worker-id 0 --scheduler 127.0.0.1:PORT [--model tiny-llada] ...

Threads:
- gRPC handlers (`Enqueue`, `Shutdown`, grpc.health.v1) validate and push blocks onto a thread-safe inbox;
  transfer orders they start at once (under `Engine.lock`);
- the loop thread (the main thread) drives the Batcher, the ModelRunner and the sampler: drain inbox ->
  `add_prefill` -> `next_microbatch` -> forward -> unmask -> `complete` -> hand the iteration's report to
  the outbox. It never waits on the scheduler or the network; the Batcher and its pool change only under
  `Engine.lock`, which the forward does not hold;
- KV link threads (disaggregated and hybrid layouts) move KV, then hand a received block to the Batcher;
- the sender thread batches reports and transfer events from the outbox into `Control.Report` calls.

A block arrives as a `BlockWork` (the request's tokens up to its first mask) and becomes a local,
single-block `sangam.request.Request` under a worker-local id (a request's next block may reach this worker
while the KV of its previous one is still held here for a transfer); the block's KV pages come from the
Batcher's pool when its prefill is admitted and go back when the block ends. Its planned forwards (or 32,
the most a block can take, when the sampler decides) are replaced by the forwards actually used as soon as
the block is fully unmasked, so `Batcher.complete` ends it on exactly that iteration.

Disaggregated and hybrid layouts (`--mode <n>P<m>D|C`) give each worker a role. A prefill worker's
Batcher hands prefilled blocks off (`hand_off=True`, budget `--prefill-budget`): they keep their pages, the
report carries the block's 32 ids, and the scheduler orders the transfer. `TransferOrder`s arrive through
`Enqueue` and are carried out by `executor.kv_transfer` link threads: SEND packs and sends the pages,
RECEIVE allocates pages here and receives into them, after which the loop gives the block to the Batcher
with `add_decode`; RELEASE frees a sent block's pages. Results come back to the loop through the inbox and
go out as `TransferEvent`s in the same report stream, each batch also carrying the pool's free pages.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import torch
from torch import Tensor

from executor import rpc
from executor.attention import TorchAttention
from executor.forward import ModelRunner
from executor.kv_cache import PagedKVCache
from executor.kv_transfer import (
    TRANSPORTS,
    KVTransfers,
    LinkConfig,
    TransferError,
    TransferJob,
    TransferResult,
    open_store,
)
from executor.live_models import lookup_live_model
from executor.microbatch import ForwardItem, Phase
from executor.models import Family, Transformer, full_size, load_checkpoint, random_model, tiny
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc
from executor.sampler import BlockStep, SamplingParams, commits_eos, unmask
from sangam.batcher import BatchConfig, Batcher, Microbatch, Policy
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool
from sangam.layout import Kind, Role, parse_mode
from sangam.request import Request
from sangam.results import ITERATION_COLUMNS, iteration_row

REPORT_BATCH = 256  # iterations per Report call at most
STAGED_TOKENS = 4096 + 1024  # transfer staging is allocated up front for a sequence this long
REPORT_ATTEMPTS = 4

log = logging.getLogger("sangam.worker")


@dataclass(slots=True, eq=False)
class Job:
    """One block of one request on this worker."""

    req: Request  # local, single-block: what the Batcher schedules
    block: int  # the block's index within the request
    block_start: int
    tokens: Tensor  # (S,) int64 on the host: prompt, committed blocks, masks; the block is updated in place
    params: SamplingParams
    forwards: int | None  # planned forwards; None: the sampler decides
    rid: int | None = None  # the scheduler's request id, when `req.id` is a worker-local id

    @property
    def request_id(self) -> int:
        return self.req.id if self.rid is None else self.rid


def sampling_params(msg: pb.SamplingParams, request_id: int) -> SamplingParams:
    return SamplingParams(
        threshold=msg.threshold if msg.HasField("threshold") else 0.9,
        temperature=msg.temperature if msg.HasField("temperature") else 0.0,
        seed=msg.seed if msg.HasField("seed") else request_id,
    )


def check_work(work: pb.BlockWork) -> str | None:
    """Why a `BlockWork` cannot be run, or None (the scheduler validated the request already)."""
    seq_len = work.prompt_len + work.mask_len
    if work.prompt_len <= 0 or work.mask_len <= 0 or work.mask_len % BLOCK:
        return f"request {work.request_id}: bad lengths prompt {work.prompt_len} mask {work.mask_len}"
    if not 0 <= work.block < work.mask_len // BLOCK:
        return f"request {work.request_id}: block {work.block} outside a mask buffer of {work.mask_len}"
    if len(work.tokens) != work.prompt_len + BLOCK * work.block or len(work.tokens) > seq_len:
        return f"request {work.request_id}: {len(work.tokens)} known tokens for block {work.block}"
    if not 0 <= work.forwards <= BLOCK:
        return f"request {work.request_id}: {work.forwards} planned forwards"
    return None


class Runner(Protocol):
    """`ModelRunner` or a drop-in (`GraphedModelRunner`): logits (items, 32, vocab) of one microbatch."""

    def forward(self, items: Sequence[ForwardItem]) -> Tensor: ...


class Engine:
    """The torch side of one worker: turns microbatches into forwards, commits, and reports.

    `jobs` is keyed by the worker-local request id (the local `Request.id`, which is also the page pool's
    owner id); `Job.request_id` is the scheduler's.
    """

    def __init__(
        self,
        worker_id: int,
        model: Transformer,
        batcher: Batcher,
        runner: Runner,
        *,
        transfers: KVTransfers | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.model = model
        self.batcher = batcher
        self.runner = runner
        self.transfers = transfers
        self.mask_id = model.config.mask_id
        self.eos_ids = model.config.eos_ids
        self.shift = model.config.logit_shift
        self.device = model.device
        self.jobs: dict[int, Job] = {}
        self.handed: dict[tuple[int, int], int] = {}  # (request id, block) -> local id: prefilled, KV kept
        self.receiving: dict[tuple[int, int], int] = {}  # (transfer id, attempt) -> local id of the KV
        self._local_ids = itertools.count()
        # The batcher, its pool and `jobs` are shared with the gRPC threads (transfer orders) and the link
        # threads (transfer results), so that transfers never wait for an iteration to end: every change
        # of them holds this lock; the forward itself runs outside it.
        self.lock = threading.Lock()
        self.emit: Callable[[pb.TransferEvent], None] = lambda event: None  # to the report stream

    def admit(self, work: pb.BlockWork) -> None:
        """Queue one block's prefill with the batcher."""
        job = self._job(work)
        with self.lock:
            self.jobs[job.req.id] = job
            self.batcher.add_prefill(job.req)

    def _job(self, work: pb.BlockWork) -> Job:
        seq_len = work.prompt_len + work.mask_len
        tokens = torch.full((seq_len,), self.mask_id, dtype=torch.long)
        tokens[: len(work.tokens)] = torch.tensor(list(work.tokens), dtype=torch.long)
        forwards = work.forwards or None
        local = next(self._local_ids)
        req = Request(local, work.arrival, work.prompt_len, BLOCK, work.mask_len, (forwards or BLOCK,))
        block_start = work.prompt_len + BLOCK * work.block
        params = sampling_params(work.sampling, work.request_id)
        return Job(req, work.block, block_start, tokens, params, forwards, work.request_id)

    # ---- KV transfers (any thread, under the lock) ----------------------------------------------------

    def transfer(self, order: pb.TransferOrder) -> None:
        """Carry out one order (any thread): a RELEASE, or an order that cannot start, emits its event at
        once; otherwise the link thread's result comes back through `transfer_done`."""
        with self.lock:
            try:
                if order.kind == pb.RELEASE:
                    self.emit(self._release(order))
                    return
                if self.transfers is None:
                    raise TransferError(f"worker {self.worker_id} has no KV links (colocated layout)")
                if order.kind == pb.SEND:
                    self._send(order)
                else:
                    self._receive(order)
            except (TransferError, ValueError, MemoryError) as err:
                now = time.monotonic()
                event = pb.TransferEvent(
                    kind=order.kind, transfer_id=order.transfer_id, attempt=order.attempt
                )
                event.ok, event.error, event.start, event.end = False, str(err), now, now
                self.emit(event)

    def _send(self, order: pb.TransferOrder) -> None:
        assert self.transfers is not None
        local = self.handed.get((order.request_id, order.block))
        if local is None:
            raise TransferError(f"no prefilled KV of request {order.request_id} block {order.block} here")
        pages = tuple(self.batcher.pool.pages_of(local))
        self.transfers.send(order.peer, self._transfer_job(order, pages))

    def _receive(self, order: pb.TransferOrder) -> None:
        assert self.transfers is not None
        reason = check_work(order.work)
        if reason is not None:
            raise ValueError(reason)
        work = order.work
        if order.pages != pages_for(work.prompt_len + work.mask_len) or len(order.block_tokens) != BLOCK:
            raise ValueError(
                f"request {order.request_id}: a transfer order of {order.pages} pages does not fit"
            )
        if not 1 <= order.step < BLOCK:
            raise ValueError(f"request {order.request_id}: cannot resume a block at step {order.step}")
        pool = self.batcher.pool
        if not pool.can_allocate(order.pages):
            raise MemoryError(f"no room for the KV: {order.pages} pages needed, {pool.num_free} free")
        job = self._job(work)
        job.tokens[job.block_start : job.block_start + BLOCK] = torch.tensor(list(order.block_tokens))
        job.req.step = order.step
        pages = tuple(pool.allocate(job.req.id, order.pages))
        self.jobs[job.req.id] = job
        self.receiving[order.transfer_id, order.attempt] = job.req.id
        try:
            self.transfers.receive(order.peer, self._transfer_job(order, pages))
        except TransferError:
            self._drop(job.req.id)
            del self.receiving[order.transfer_id, order.attempt]
            raise

    @staticmethod
    def _transfer_job(order: pb.TransferOrder, pages: tuple[int, ...]) -> TransferJob:
        return TransferJob(
            order.transfer_id, order.attempt, order.request_id, order.tag, order.generation, pages
        )

    def _release(self, order: pb.TransferOrder) -> pb.TransferEvent:
        local = self.handed.pop((order.request_id, order.block), None)
        if local is None:
            raise TransferError(f"no KV of request {order.request_id} block {order.block} to release here")
        self._drop(local)
        now = time.monotonic()
        return pb.TransferEvent(
            kind=pb.RELEASE, transfer_id=order.transfer_id, attempt=order.attempt, ok=True, start=now, end=now
        )

    def _drop(self, local: int) -> None:
        """Forget a job that holds pages outside the batcher's queues, and free its pages."""
        job = self.jobs.pop(local)
        self.batcher.release(job.req)

    def transfer_done(self, result: TransferResult) -> None:
        """A link thread finished one end of an attempt: a received block joins the decodes at once.

        The RECEIVE event is emitted before the lock is let go, so it precedes every report of the decode.
        """
        job = result.job
        event = pb.TransferEvent(
            kind=pb.SEND if result.send else pb.RECEIVE, transfer_id=job.transfer_id, attempt=job.attempt,
            ok=result.ok, error=result.error, start=result.start, end=result.end, bytes=result.nbytes,
        )  # fmt: skip
        with self.lock:
            if not result.send:
                local = self.receiving.pop((job.transfer_id, job.attempt))
                if result.ok:
                    self.batcher.add_decode(self.jobs[local].req)
                else:
                    self._drop(local)
            self.emit(event)

    def step(self, on_launch: Callable[[], None] = lambda: None) -> pb.IterationReport | None:
        """Run one iteration; None if the batcher formed an empty microbatch. `on_launch` is called once
        the iteration's GPU work is queued, before its wait for the results."""
        with self.lock:  # the start is read under the lock: a block a link thread adds meanwhile is in `mb`
            start = time.monotonic()
            mb = self.batcher.next_microbatch(start)
            if mb.empty:
                return None
            decodes = [self.jobs[r.id] for r in mb.decodes]
            prefills = [self.jobs[r.id] for r in mb.prefills]
        jobs = decodes + prefills
        items = [ForwardItem(j.req.id, Phase.DECODE, j.tokens, j.block_start) for j in decodes]
        items += [ForwardItem(j.req.id, Phase.PREFILL, j.tokens, j.block_start) for j in prefills]
        steps = [BlockStep(j.params, j.block, j.req.step, j.forwards) for j in jobs]
        blocks = torch.stack([j.tokens[j.block_start : j.block_start + BLOCK] for j in jobs])

        logits, gpu_s = self._timed_forward(items)
        committed = unmask(blocks, logits, steps, self.mask_id)
        on_launch()
        new_blocks = committed.cpu()
        gpu_s = gpu_s()
        done: dict[int, Tensor] = {}
        for job, new in zip(jobs, new_blocks, strict=True):
            job.tokens[job.block_start : job.block_start + BLOCK] = new
            forwards = job.req.step + 1  # including this one
            if not bool((new == self.mask_id).any()):
                job.req.steps = (forwards,)
                done[job.req.id] = new
            elif forwards >= job.req.steps[0]:  # cannot happen: every forward commits at least one mask
                log.warning(
                    "request %d block %d still masked after %d forwards", job.req.id, job.block, forwards
                )
                job.req.steps = (forwards + 1,)
        end = time.monotonic()
        with self.lock:
            return self._complete(mb, start, end, items, done, gpu_s)

    def _complete(
        self,
        mb: Microbatch,
        start: float,
        end: float,
        items: Sequence[ForwardItem],
        done: dict[int, Tensor],
        gpu_s: float,
    ) -> pb.IterationReport:
        outcome = self.batcher.complete(mb, end)
        report = pb.IterationReport(stats=self._stats(start, end, mb), gpu_s=gpu_s)
        for item in items:
            query = item.seq_len if item.phase is Phase.PREFILL else BLOCK + self.shift
            kind = pb.PREFILL if item.phase is Phase.PREFILL else pb.DECODE
            report.items.add(kind=kind, query_tokens=query, context_len=item.seq_len)
        handoffs = {id(r) for r in outcome.handoffs}
        for req in outcome.prefilled:
            rec, job = req.blocks[0], self.jobs[req.id]
            assert rec.prefill_start is not None and rec.prefill_end is not None
            entry = report.prefilled.add(
                request_id=job.request_id,
                block=job.block,
                prefill_start=rec.prefill_start,
                prefill_end=rec.prefill_end,
            )
            if id(req) in handoffs:  # the KV stays here until the scheduler's RELEASE
                entry.handoff = True
                entry.block_tokens.extend(job.tokens[job.block_start : job.block_start + BLOCK].tolist())
                self.handed[job.request_id, job.block] = req.id
        for req in outcome.finished:
            job, rec, tokens = self.jobs.pop(req.id), req.blocks[0], done[req.id]
            assert rec.end is not None
            entry = report.finished.add(
                request_id=job.request_id,
                block=job.block,
                tokens=tokens.tolist(),
                forwards=req.steps[0],
                end=rec.end,
                eos=commits_eos(tokens, self.eos_ids),
            )
            if rec.decode_start is not None:
                entry.decode_start = rec.decode_start
        return report

    def _timed_forward(self, items: Sequence[ForwardItem]) -> tuple[Tensor, Any]:
        """Logits, and a callable giving the forward's seconds once the results are on the host."""
        if self.device.type == "cuda":
            begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            logits = self.runner.forward(items)
            finish.record()
            return logits, lambda: begin.elapsed_time(finish) / 1000.0
        t0 = time.perf_counter()
        logits = self.runner.forward(items)
        seconds = time.perf_counter() - t0
        return logits, lambda: seconds

    def _stats(self, start: float, end: float, mb: Microbatch) -> pb.IterationStats:
        row = dict(zip(ITERATION_COLUMNS, iteration_row(self.worker_id, start, end, mb), strict=True))
        row["memory_blocked"] = int(row["memory_blocked"])
        return pb.IterationStats(**row)


class WorkerServicer(pb_grpc.WorkerServicer):
    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker

    def Enqueue(self, request: pb.EnqueueBatch, context: grpc.ServicerContext) -> pb.EnqueueReply:
        for work in request.blocks:
            reason = check_work(work)
            if reason is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        if self.worker.stopping.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "worker is shutting down")
        if request.blocks:
            self.worker.inbox.put(list(request.blocks))
        for order in request.transfers:  # right away, in the order the scheduler issued them
            self.worker.engine.transfer(order)
        if request.transfers:
            self.worker.wake()  # a RELEASE may let a waiting prefill in
        return pb.EnqueueReply(accepted=len(request.blocks) + len(request.transfers))

    def Shutdown(self, request: pb.ShutdownRequest, context: grpc.ServicerContext) -> pb.ShutdownReply:
        self.worker.stop("shutdown requested")
        return pb.ShutdownReply()


Outbound = pb.IterationReport | pb.TransferEvent


class WorkerProcess:
    """The process around one `Engine`: inbox, loop, outbox and sender."""

    def __init__(self, worker_id: int, engine: Engine, control: pb_grpc.ControlStub) -> None:
        self.worker_id = worker_id
        self.engine = engine
        self.control = control
        self.inbox: queue.SimpleQueue[list[pb.BlockWork]] = queue.SimpleQueue()  # [] only wakes the loop
        self.outbox: queue.SimpleQueue[Outbound | None] = queue.SimpleQueue()
        engine.emit = self.outbox.put
        self.stopping = threading.Event()
        self.failure: str | None = None
        self.step_started: float | None = None  # when the iteration in progress began
        self._sender = threading.Thread(target=self._send_loop, name="report-sender", daemon=True)

    def stop(self, why: str) -> None:
        if not self.stopping.is_set():
            log.info("stopping: %s", why)
        self.stopping.set()

    def fail(self, why: str) -> None:
        self.failure = self.failure or why
        self.stop(why)

    def run(self) -> None:
        """The loop thread; returns when stopped."""
        self._sender.start()
        batcher = self.engine.batcher
        # An iteration's report goes out once the next iteration's GPU work is queued (or the loop has
        # nothing to run): the sender's Python then runs while this thread waits on the GPU, instead of
        # holding the GIL through the next iteration's host work. It reaches the scheduler no later than
        # it could matter: a block dispatched meanwhile could not join the iteration already started.
        # The last held report learns its cycle (start to this loop's next start) when the loop goes
        # straight on to the next iteration.
        held: list[pb.IterationReport] = []
        straight_on = False

        def release() -> None:
            if straight_on and held and self.step_started is not None:
                held[-1].cycle_s = self.step_started - held[-1].stats.start
            for report in held:
                self.outbox.put(report)
            held.clear()

        try:
            while not self.stopping.is_set():
                straight_on = batcher.has_work
                if not straight_on:
                    release()
                self._drain(wait=not batcher.has_work)
                if not batcher.has_work:
                    continue
                self.step_started = time.monotonic()
                report = self.engine.step(on_launch=release)
                self.step_started = None
                if report is None:  # nothing could run (cannot happen with validated requests)
                    time.sleep(0.001)
                    continue
                held.append(report)
        finally:
            release()
            self.outbox.put(None)
            self._sender.join(timeout=2.0)

    def watch_for_hangs(self, timeout: float, on_hang: Callable[[str], None]) -> None:
        """Call `on_hang` once (from a thread) if one iteration runs longer than `timeout` seconds."""

        def watch() -> None:
            while not self.stopping.wait(1.0):
                started = self.step_started
                if started is not None and time.monotonic() - started > timeout:
                    on_hang(f"an iteration has run for more than {timeout:g} s")
                    return

        threading.Thread(target=watch, name="hang-watch", daemon=True).start()

    def on_transfer(self, result: TransferResult) -> None:
        """From a link thread: a received block can decode now; wake the loop if it idles."""
        self.engine.transfer_done(result)
        self.wake()

    def wake(self) -> None:
        self.inbox.put([])

    def _drain(self, wait: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.05) if wait else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            for work in item:
                self.engine.admit(work)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _send_loop(self) -> None:
        while True:
            first = self.outbox.get()
            if first is None:
                return
            batch = [first]
            last = False
            while len(batch) < REPORT_BATCH:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    last = True
                    break
                batch.append(item)
            message = pb.ReportBatch(
                worker_id=self.worker_id,
                iterations=[r for r in batch if isinstance(r, pb.IterationReport)],
                transfers=[e for e in batch if isinstance(e, pb.TransferEvent)],
                free_pages=self.engine.batcher.pool.num_free,  # read after every queued change was made
            )
            if not self._send(message):
                return
            if last:
                return

    def _send(self, message: pb.ReportBatch) -> bool:
        for attempt in range(REPORT_ATTEMPTS):
            try:
                self.control.Report(message, timeout=rpc.CALL_TIMEOUT_S)
                return True
            except grpc.RpcError as err:
                if self.stopping.is_set():
                    return False
                if attempt == REPORT_ATTEMPTS - 1:
                    self.fail(f"cannot report to the scheduler: {rpc.describe(err)}")
                    return False
                time.sleep(0.2 * 2**attempt)
        return False


def build_model(name: str, weights: str, device: torch.device, seed: int) -> Transformer:
    """The served model: the named config with seeded random weights, or a local checkpoint."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if weights != "random":
        return load_checkpoint(weights, dtype=dtype, device=device)
    spec = lookup_live_model(name)
    family = Family(spec.family)
    config = tiny(family) if spec.tiny else full_size(family)
    return random_model(config, dtype=dtype, device=device, seed=seed)


def build_runner(model: Transformer, cache: PagedKVCache, *, cuda_graphs: bool) -> Runner:
    """The torch backend on CPU; on CUDA FlashInfer (when installed) and decode CUDA graphs."""
    if model.device.type != "cuda":
        return ModelRunner(model, cache, TorchAttention())
    from executor.flashinfer_backend import make_backend, supports, warm_up_kernels

    kv_dtype = cache.layers[0].dtype
    if supports(model.device, model.dtype):
        warm_up_kernels(model.device, dtype=model.dtype, head_dims=(model.config.head_dim,))
    backend = make_backend(model.device, model.config, dtype=model.dtype, kv_dtype=kv_dtype)
    runner = ModelRunner(model, cache, backend)
    if not cuda_graphs or not supports(model.device, model.dtype):
        return runner
    from executor.cuda_graphs import GraphedModelRunner

    return GraphedModelRunner(runner)  # takes its padding pages from the pool now


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m executor.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--scheduler", required=True, help="host:port of the scheduler's Control service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="tiny-llada")
    parser.add_argument("--weights", default="random", help="'random' or a local HF checkpoint directory")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pages", type=int, required=True)
    parser.add_argument("--policy", choices=[p.value for p in Policy], default=Policy.DEFICIT.value)
    parser.add_argument("--budget", type=int, default=1024, help="tau of colocated and decode-role workers")
    parser.add_argument("--prefill-budget", type=int, default=2048, help="tau of a prefill-role worker")
    parser.add_argument(
        "--mode", default="colocated", help="the layout: colocated, <n>C, <n>P<m>D or <n>P<m>C"
    )
    parser.add_argument("--num-workers", type=int, help="workers of the layout (default: this one only)")
    parser.add_argument(
        "--dist-port", type=int, default=0, help="KV rendezvous store port (worker 0 hosts it)"
    )
    parser.add_argument("--dist-host", default="127.0.0.1", help="host of the KV rendezvous store")
    parser.add_argument("--kv-transport", choices=TRANSPORTS, default="gloo")
    parser.add_argument("--transfer-timeout", type=float, default=30.0, help="seconds per transfer attempt")
    parser.add_argument(
        "--dist-timeout", type=float, default=120.0, help="seconds for the KV rendezvous and link (re)builds"
    )
    parser.add_argument(
        "--fault-stall-recv", type=int, help=argparse.SUPPRESS
    )  # tests: stall this request's receives
    parser.add_argument("--max-decodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="random weights (identical on every worker)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--cuda-graphs", action=argparse.BooleanOptionalAction, default=True, help="decode graphs on CUDA"
    )
    parser.add_argument(
        "--hang-timeout", type=float, default=300.0, help="report unhealthy if one iteration runs this long"
    )
    parser.add_argument("--exit-with-parent", action="store_true")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def connect_links(args: argparse.Namespace, roles: Sequence[Role], device: torch.device) -> KVTransfers:
    """Open the rendezvous store (worker 0 hosts it) and build this worker's KV links."""
    if args.dist_port <= 0:
        raise ValueError("a disaggregated or hybrid layout needs --dist-port (the KV rendezvous store)")
    if args.kv_transport == "nccl" and device.type != "cuda":
        raise ValueError("the nccl KV transport needs a CUDA device")
    if args.kv_transport == "nccl":
        os.environ.setdefault(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"
        )  # a timed-out link is aborted, not fatal
        torch.cuda.set_device(device)
    me = args.worker_id
    prefill = [w for w, r in enumerate(roles) if r is Role.PREFILL]
    decode = [w for w, r in enumerate(roles) if r is not Role.PREFILL]
    store = open_store(args.dist_host, args.dist_port, is_master=me == 0, timeout_s=args.dist_timeout)
    config = LinkConfig(args.kv_transport, args.transfer_timeout, args.dist_timeout, host=args.dist_host)
    transfers = KVTransfers(
        me,
        sends_to=decode if roles[me] is Role.PREFILL else [],
        receives_from=prefill if roles[me] is not Role.PREFILL else [],
        store=store,
        config=config,
        on_result=lambda result: None,  # replaced once the worker's loop exists
        device=device,
        stall_request=args.fault_stall_recv,
    )
    transfers.connect()
    return transfers


def register(control: pb_grpc.ControlStub, message: pb.RegisterRequest, timeout: float = 30.0) -> None:
    """Register with the scheduler, retrying while it is not reachable yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = control.Register(message, timeout=rpc.CALL_TIMEOUT_S, wait_for_ready=True)
            break
        except grpc.RpcError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot register with the scheduler: {rpc.describe(err)}") from None
            time.sleep(0.2)
    if not reply.accepted:
        raise RuntimeError(f"the scheduler refused registration: {reply.error}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rpc.setup_logging(f"worker-{args.worker_id}", args.log_level)
    torch.set_num_threads(args.threads)
    srv: grpc.Server | None = None
    process: WorkerProcess | None = None

    def on_signal(signum: int, frame: object) -> None:
        if process is not None:
            process.stop(f"signal {signum}")
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    transfers: KVTransfers | None = None
    try:
        device = torch.device(args.device)
        layout = parse_mode(args.mode, args.num_workers or args.worker_id + 1)
        if not 0 <= args.worker_id < layout.num_workers:
            raise ValueError(
                f"worker id {args.worker_id} outside the {layout.num_workers} workers of {args.mode}"
            )
        role = layout.roles[args.worker_id]
        if layout.kind is not Kind.COLOCATED:  # join the KV links first: every worker is starting now
            transfers = connect_links(args, layout.roles, device)
        model = build_model(args.model, args.weights, device, args.seed)
        pool = PagePool(args.pages)
        budget = args.prefill_budget if role is Role.PREFILL else args.budget
        batcher = Batcher(
            args.worker_id,
            BatchConfig(Policy(args.policy), budget, args.max_decodes),
            pool,
            hand_off=role is Role.PREFILL,
        )
        cache = PagedKVCache.for_model(pool, model.config, dtype=model.dtype, device=device)
        runner = build_runner(model, cache, cuda_graphs=args.cuda_graphs)
        if transfers is not None:  # staging for the longest sequence a request may have (4096 + 1024)
            transfers.attach(cache.layers, reserve_pages=min(pool.num_free, pages_for(STAGED_TOKENS)))
        engine = Engine(args.worker_id, model, batcher, runner, transfers=transfers)
        control = pb_grpc.ControlStub(rpc.channel(args.scheduler))
        process = WorkerProcess(args.worker_id, engine, control)
        if transfers is not None:
            transfers.set_on_result(process.on_transfer)
        srv = rpc.server(threads=4)
        pb_grpc.add_WorkerServicer_to_server(WorkerServicer(process), srv)
        health = rpc.add_health(srv)
        address = rpc.bind(srv, args.host, args.port)
        srv.start()
        config = model.config
        register(
            control,
            pb.RegisterRequest(
                worker_id=args.worker_id,
                address=address,
                pages=pool.num_free,  # what requests can use: CUDA graphs keep a few padding pages
                vocab=config.vocab,
                mask_id=config.mask_id,
                eos_ids=list(config.eos_ids),
                model=args.model if args.weights == "random" else str(args.weights),
                device=str(device),
                pid=os.getpid(),
                role=role.value,
            ),
        )
        rpc.set_serving(health, True)

        def on_hang(why: str) -> None:  # the scheduler's health checks then declare this worker lost
            print(f"worker {args.worker_id}: error: {why}", file=sys.stderr, flush=True)
            rpc.set_serving(health, False)

        process.watch_for_hangs(args.hang_timeout, on_hang)
        if args.exit_with_parent:
            rpc.exit_with_parent(lambda: process.stop("the launcher is gone") if process else None)
        process.run()
        rpc.set_serving(health, False)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # the traceback, then one line: the launcher reports the last line
        traceback.print_exc()
        print(f"worker {args.worker_id}: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        if srv is not None:
            srv.stop(grace=0.5).wait(2.0)
        if transfers is not None:
            transfers.close()
        if process is not None:
            pool = process.engine.batcher.pool
            print(
                f"worker {args.worker_id}: {pool.num_free} KV pages free at exit", file=sys.stderr, flush=True
            )
    if process is not None and process.failure:
        print(f"worker {args.worker_id}: error: {process.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
