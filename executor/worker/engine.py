"""The torch side of one worker: blocks become jobs, microbatches become forwards, and each iteration a
typed `IterationReport`.

A block arrives as a `BlockWork` (the request's tokens up to its first mask) and becomes a local,
single-block `sangam.request.Request` under a worker-local id (a request's next block may reach this worker
while the KV of its previous one is still held here for a transfer); the block's KV pages come from the
Batcher's pool when its prefill is admitted and go back when the block ends. Its planned forwards (or 32,
the most a block can take, when the sampler decides) are replaced by the forwards actually used as soon as
the block is fully unmasked, so `Batcher.complete` ends it on exactly that iteration.

A prefill-role worker's Batcher hands prefilled blocks off (`hand_off=True`): they keep their pages, the
report carries the block's 32 ids, and the scheduler orders the transfer; the worker's own ends of KV
transfers are `executor.transfer.ends.TransferEnds` (`executor.transfer.links` moves the bytes), which work
on this engine's jobs, batcher and pool under its lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import Tensor

from executor.control.messages import (
    BlockDone,
    BlockWork,
    ItemShape,
    IterationReport,
    IterationStats,
    Logprobs,
    Prefilled,
    Sampling,
    TransferEvent,
    TransferOrder,
)
from executor.model.attention import TorchAttention
from executor.model.config import Family, full_size, tiny
from executor.model.forward import ModelRunner
from executor.model.fp8 import quantize_model, quantized, scaled_gemm_ok
from executor.model.kv_cache import PagedKVCache
from executor.model.live_models import lookup_live_model
from executor.model.loading import load_checkpoint, random_model
from executor.model.microbatch import ForwardItem, Phase
from executor.model.prefill_attention import make_prefill_attention
from executor.model.sampler import BlockStep, SamplingParams, commits_eos, unmask
from executor.model.transformer import Transformer
from executor.transfer.ends import TransferEnds
from executor.transfer.links import KVTransfers, TransferResult
from executor.worker.logprobs import BlockLogprobs, ForwardScores
from runs.results import iteration_row
from sangam.batcher import Batcher, Microbatch
from sangam.hardware import BLOCK
from sangam.request import Request

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
    call: int = 0  # the Enqueue call that brought it (a drop applies to the work of earlier calls)
    logprobs: BlockLogprobs | None = None  # the request asked for them (`Sampling.logprobs`)

    @property
    def request_id(self) -> int:
        return self.req.id if self.rid is None else self.rid


def sampling_params(sampling: Sampling, request_id: int) -> SamplingParams:
    """The sampler's parameters of a request; what it left unset takes the defaults (seed: its id)."""
    return SamplingParams(
        threshold=0.9 if sampling.threshold is None else sampling.threshold,
        temperature=0.0 if sampling.temperature is None else sampling.temperature,
        seed=request_id if sampling.seed is None else sampling.seed,
    )


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
        self.ends = TransferEnds(self, transfers)  # its own ends of KV transfers
        self.mask_id = model.config.mask_id
        self.eos_ids = model.config.eos_ids
        self.shift = model.config.logit_shift
        self.first_at_refresh = model.config.family is Family.DREAM  # Dream's block start (sampler.py)
        self.device = model.device
        self.jobs: dict[int, Job] = {}
        self._local_ids = itertools.count()
        # The batcher, its pool and `jobs` are shared with the gRPC threads (transfer orders) and the link
        # threads (transfer results), so that transfers never wait for an iteration to end: every change
        # of them holds this lock; the forward itself runs outside it.
        self.lock = threading.Lock()
        self.emit: Callable[[TransferEvent], None] = lambda event: None  # to the report stream

    def admit(self, work: BlockWork, call: int = 0) -> None:
        """Queue one block's prefill with the batcher (`call`: the Enqueue call that brought it)."""
        job = self.new_job(work, call)
        with self.lock:
            self.jobs[job.req.id] = job
            self.batcher.add_prefill(job.req)

    def drop(self, request_id: int, before: int) -> int:
        """Forget the work of request `request_id` that Enqueue calls before `before` brought: its queued
        or seated block leaves the batcher with its pages, KV kept for a transfer is freed, and a KV being
        received is freed once its receive ends (the link thread writes into it until then). Call it
        between iterations (no forward in flight may use the pages). The number of blocks dropped."""
        with self.lock:
            mine = [j for j in self.jobs.values() if j.request_id == request_id and j.call < before]
            for job in mine:
                if self.ends.forget(job.req.id):
                    del self.jobs[job.req.id]
                    self.batcher.drop(job.req)
        if mine:
            log.info("dropped request %d (%d blocks)", request_id, len(mine))
        return len(mine)

    def new_job(self, work: BlockWork, call: int = 0) -> Job:
        """A job for `work` under a new worker-local id (not yet in `jobs`)."""
        seq_len = work.prompt_len + work.mask_len
        tokens = torch.full((seq_len,), self.mask_id, dtype=torch.long)
        tokens[: len(work.tokens)] = torch.tensor(work.tokens, dtype=torch.long)
        forwards = work.forwards or None
        local = next(self._local_ids)
        req = Request(local, work.arrival, work.prompt_len, BLOCK, work.mask_len, (forwards or BLOCK,))
        block_start = work.prompt_len + BLOCK * work.block
        params = sampling_params(work.sampling, work.request_id)
        top = work.sampling.logprobs
        logprobs = BlockLogprobs(top) if top is not None else None
        return Job(req, work.block, block_start, tokens, params, forwards, work.request_id, call, logprobs)

    # ---- KV transfers (any thread) -------------------------------------------------------------------

    def transfer(self, order: TransferOrder, call: int = 0) -> None:
        """Carry out one KV transfer order (`call`: the Enqueue call that brought it): `TransferEnds`."""
        with self.lock:
            self.ends.order(order, call)

    def transfer_done(self, result: TransferResult) -> None:
        """A link thread finished one end of an attempt; `TransferEnds.done`."""
        with self.lock:
            self.ends.done(result)

    def free(self, local: int) -> None:
        """Forget a job that holds pages outside the batcher's queues, and free its pages (under the lock)."""
        job = self.jobs.pop(local)
        self.batcher.release(job.req)

    def receiving_job(
        self, work: BlockWork, call: int, block_tokens: Sequence[int], step: int, pages: int,
        block_logprobs: Logprobs | None = None,
    ) -> tuple[int, tuple[int, ...]]:  # fmt: skip
        """A job for a block whose KV `TransferEnds` receives, resumed at `step` with `block_tokens` (and
        their `block_logprobs`, if asked), with `pages` pages allocated to it (under the lock): its local
        id and the pages."""
        job = self.new_job(work, call)
        job.tokens[job.block_start : job.block_start + BLOCK] = torch.tensor(list(block_tokens))
        if block_logprobs is not None:
            job.logprobs = BlockLogprobs.resumed(block_logprobs)
        job.req.step = step
        allocated = tuple(self.batcher.pool.allocate(job.req.id, pages))
        self.jobs[job.req.id] = job
        return job.req.id, allocated

    def start_decode(self, local: int) -> None:
        """A job whose KV was received joins the batcher's decodes (under the lock)."""
        self.batcher.add_decode(self.jobs[local].req)

    def step(self, on_launch: Callable[[], None] = lambda: None) -> IterationReport | None:
        """Run one iteration; None if the batcher formed an empty microbatch. `on_launch` is called once
        the iteration's GPU work is queued, before its wait for the results."""
        with self.lock:  # the start is read under the lock: a block a link thread adds meanwhile is in `mb`
            start = time.monotonic()
            mb = self.batcher.next_microbatch(start)
            if mb is None or mb.empty:
                return None
            decodes = [self.jobs[r.id] for r in mb.decodes]
            prefills = [self.jobs[r.id] for r in mb.prefills]
        jobs = decodes + prefills
        items = [ForwardItem(j.req.id, Phase.DECODE, j.tokens, j.block_start) for j in decodes]
        items += [ForwardItem(j.req.id, Phase.PREFILL, j.tokens, j.block_start) for j in prefills]
        steps = [BlockStep(j.params, j.block, j.req.step, j.forwards) for j in jobs]
        blocks = torch.stack([j.tokens[j.block_start : j.block_start + BLOCK] for j in jobs])

        logits, gpu_s = self._timed_forward(items)
        sampled = unmask(blocks, logits, steps, self.mask_id, first_at_refresh=self.first_at_refresh)
        asking = {i: j.logprobs for i, j in enumerate(jobs) if j.logprobs is not None}
        scores = None
        if asking:  # else nothing more than the sampler's work
            top = max(logprobs.top for logprobs in asking.values())
            scores = ForwardScores.launch(sampled.logprobs, sampled.tokens, list(asking), top)
        on_launch()
        new_blocks = sampled.tokens.cpu()
        gpu_s = gpu_s()
        if scores is not None:
            self._record(asking, blocks, new_blocks, scores.host())
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
        decoded = tuple(j.request_id for j in decodes)
        with self.lock:
            return self._complete(mb, start, end, items, done, gpu_s, decoded)

    def _record(
        self, asking: dict[int, BlockLogprobs], before: Tensor, after: Tensor, scores: ForwardScores
    ) -> None:
        """The positions this forward committed (masked `before`, not `after`) of the items `asking` for
        log-probs take theirs from its `scores`, whose rows are those items' in order."""
        for row, (i, logprobs) in enumerate(asking.items()):
            logprobs.record((before[i] == self.mask_id) & (after[i] != self.mask_id), scores, row)

    def _complete(
        self,
        mb: Microbatch,
        start: float,
        end: float,
        items: Sequence[ForwardItem],
        done: dict[int, Tensor],
        gpu_s: float,
        decoded: tuple[int, ...] = (),
    ) -> IterationReport:
        outcome = self.batcher.complete(mb, end)
        shapes = tuple(
            ItemShape(True, item.seq_len, item.seq_len)
            if item.phase is Phase.PREFILL
            else ItemShape(False, BLOCK + self.shift, item.seq_len)
            for item in items
        )
        handoffs = {id(r) for r in outcome.handoffs}
        prefilled = []
        for req in outcome.prefilled:
            rec, job = req.blocks[0], self.jobs[req.id]
            assert rec.prefill_start is not None and rec.prefill_end is not None
            entry = Prefilled(job.request_id, job.block, rec.prefill_start, rec.prefill_end)
            if id(req) in handoffs:  # the KV stays here until the scheduler's RELEASE
                block_tokens = tuple(job.tokens[job.block_start : job.block_start + BLOCK].tolist())
                block_logprobs = job.logprobs.message() if job.logprobs is not None else None
                entry = replace(entry, handoff=True, block_tokens=block_tokens, block_logprobs=block_logprobs)
                self.ends.keep(job.request_id, job.block, req.id)
            prefilled.append(entry)
        finished = []
        for req in outcome.finished:
            job, rec, tokens = self.jobs.pop(req.id), req.blocks[0], done[req.id]
            assert rec.end is not None
            eos = commits_eos(tokens, self.eos_ids)
            ids = tuple(tokens.tolist())
            logprobs = job.logprobs.message() if job.logprobs is not None else None
            done_block = BlockDone(
                job.request_id, job.block, ids, req.steps[0], rec.end, eos, rec.decode_start, logprobs
            )
            finished.append(done_block)
        # the log's end: once the report is assembled, so that end - start is the whole step a profile times
        # and what follows, to the next start, the worker loop's own (`calib.worker_loop`)
        stats = self._stats(start, time.monotonic(), mb)
        return IterationReport(stats, gpu_s, shapes, tuple(prefilled), tuple(finished), decoded=decoded)

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

    def _stats(self, start: float, end: float, mb: Microbatch) -> IterationStats:
        return IterationStats(*iteration_row(self.worker_id, start, end, mb))


def build_model(
    name: str, weights: str, device: torch.device, seed: int, *, quantization: str | None = None
) -> Transformer:
    """The served model: the named config with seeded random weights, or a local checkpoint; with
    `quantization` ('fp8') its linear layers quantized at load (`executor.model.fp8.quantize_model`)."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if weights != "random":
        model = load_checkpoint(weights, dtype=dtype, device=device)
    else:
        spec = lookup_live_model(name)
        family = Family(spec.family)
        config = tiny(family) if spec.tiny else full_size(family)
        model = random_model(config, dtype=dtype, device=device, seed=seed)
    if quantization is not None:
        quantize_model(model, quantization)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the bf16 weights the quantized ones replaced
        if not scaled_gemm_ok(device, dtype):
            log.warning("--quantization %s on %s (%s): a dequantizing reference path, no speed-up",
                        quantization, device, dtype)  # fmt: skip
    return model


def build_runner(model: Transformer, cache: PagedKVCache, *, cuda_graphs: bool) -> Runner:
    """The torch backend on CPU; on CUDA FlashInfer (when installed), decode CUDA graphs and, for FP8
    weights, the body of other microbatches from piecewise graphs (`executor.model.piecewise_graphs`)."""
    kv_dtype = cache.layers[0].dtype
    prefill = make_prefill_attention(model.device, model.config, model.dtype, kv_dtype)
    if model.device.type != "cuda":
        return ModelRunner(model, cache, TorchAttention(), prefill)
    from executor.model.flashinfer_backend import make_backend, supports, warm_up_kernels

    if supports(model.device, model.dtype, kv_dtype):
        head_dims = (model.config.shape.head_dim,)
        warm_up_kernels(model.device, dtype=model.dtype, kv_dtype=kv_dtype, head_dims=head_dims)
    backend = make_backend(model.device, model.config, dtype=model.dtype, kv_dtype=kv_dtype)
    if not cuda_graphs or not supports(model.device, model.dtype, kv_dtype):
        return ModelRunner(model, cache, backend, prefill)
    from executor.model.cuda_graphs import GraphedModelRunner
    from executor.model.piecewise_graphs import PiecewiseGraphs

    # an eager FP8 forward's launches take longer than a small one's kernels: its body replays from graphs
    fp8 = quantized(model) and scaled_gemm_ok(model.device, model.dtype)
    pieces = PiecewiseGraphs(model) if fp8 else None
    runner = ModelRunner(model, cache, backend, prefill, pieces)
    return GraphedModelRunner(runner)  # takes its padding pages from the pool now
