"""`Engine.step` against a KV link thread that holds the engine's lock (CPU, tiny model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from test_scheduler_state import one_worker

from executor.control.messages import (
    BlockWork,
    ItemShape,
    Submission,
    TransferEvent,
    TransferKind,
    TransferOrder,
)
from executor.model.attention import TorchAttention
from executor.model.config import Family, tiny
from executor.model.forward import ModelRunner
from executor.model.kv_cache import PagedKVCache
from executor.model.loading import random_model
from executor.transfer.links import TransferJob, TransferResult
from executor.worker.engine import Engine
from sangam.batcher import Batcher
from sangam.budget import BatchConfig
from sangam.hardware import BLOCK, pages_for
from sangam.kv import PagePool


class LinkFirstLock:
    """The engine's lock, except that its next acquisition first lets `link` run (a link thread that got
    the lock just before), re-entrantly."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.link: Callable[[], None] | None = None

    def __enter__(self) -> LinkFirstLock:
        link, self.link = self.link, None
        if link is not None:
            link()
        self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def test_a_block_received_while_an_iteration_waits_for_the_lock_decodes_after_its_kv_arrived() -> None:
    model = random_model(tiny(Family.LLADA), dtype=torch.float32, seed=0, std=0.1)
    pool = PagePool(16)
    cache = PagedKVCache.for_model(pool, model.config, dtype=torch.float32, device="cpu")
    for layer in cache.layers:  # the "received" KV: finite values
        layer.zero_()
    engine = Engine(0, model, Batcher(0, BatchConfig(), pool), ModelRunner(model, cache, TorchAttention()))
    lock = LinkFirstLock()
    engine.lock = lock  # type: ignore[assignment]
    events: list[TransferEvent] = []
    engine.emit = events.append
    prompt = 20
    work = BlockWork(
        request_id=7,
        arrival=0.0,
        block=0,
        prompt_len=prompt,
        mask_len=BLOCK,
        tokens=tuple(range(1, prompt + 1)),
    )
    job = engine.new_job(work)  # as a RECEIVE order registers it: pages allocated, resuming at step 1
    job.req.step = 1
    pages = tuple(pool.allocate(job.req.id, pages_for(prompt + BLOCK)))
    engine.jobs[job.req.id] = job
    engine.ends.receiving[3, 1] = job.req.id

    def receive_ends() -> None:
        end = time.monotonic()
        engine.transfer_done(
            TransferResult(False, TransferJob(3, 1, 7, 0, 0, pages), 1, True, "", end, end, 0)
        )

    lock.link = receive_ends
    report = engine.step()
    assert report is not None and len(report.items) == 1 and not report.items[0].prefill
    (event,) = events
    assert event.kind is TransferKind.RECEIVE and event.ok
    assert job.req.record.decode_start is not None and job.req.record.decode_start >= event.end
    assert report.stats.start >= event.end


def engine(pages: int = 16, hand_off: bool = False) -> Engine:
    model = random_model(tiny(Family.LLADA), dtype=torch.float32, seed=0, std=0.1)
    pool = PagePool(pages)
    cache = PagedKVCache.for_model(pool, model.config, dtype=torch.float32, device="cpu")
    batcher = Batcher(0, BatchConfig(), pool, hand_off=hand_off)
    return Engine(0, model, batcher, ModelRunner(model, cache, TorchAttention()))


def block(rid: int, forwards: int = 3, prompt: int = 20) -> BlockWork:
    return BlockWork(rid, float(rid), 0, prompt, BLOCK, tuple(range(1, prompt + 1)), forwards)


def test_a_64_token_request_runs_over_its_prompt_plus_64_tokens_on_the_worker() -> None:
    """A scheduler whose mask buffer is 1,024 tokens sends a 64-token request's block as prompt + 64: the
    worker's sequence, its KV pages and the model's input are that long (20 + 1,024 would not fit here)."""
    core, sent = one_worker(1024)
    tracked = core.submit(Submission(tuple(range(1, 21)), gen_len=64, forwards=(2, 2)))
    core.on_arrival(tracked)
    ((_, work),) = sent
    assert isinstance(work, BlockWork)
    e = engine(pages=16)
    e.admit(work)
    (job,) = e.jobs.values()
    assert job.tokens.shape == (20 + 64,)
    report = e.step()
    assert report is not None and report.items == (ItemShape(True, 84, 84),)
    assert e.batcher.pool.num_used == pages_for(84)


def test_a_drop_frees_a_running_blocks_pages_between_iterations_and_spares_later_calls_work() -> None:
    e = engine()
    e.admit(block(7), call=1)
    e.admit(block(8), call=1)
    first = e.step()
    assert first is not None and {p.request_id for p in first.prefilled} == {7, 8}
    held = e.batcher.pool.num_free
    assert e.drop(7, before=1) == 0  # the work came with call 1: not that drop's
    assert e.drop(7, before=2) == 1
    assert e.batcher.pool.num_free == held + pages_for(20 + BLOCK)
    second = e.step()
    assert second is not None and second.decoded == (8,)
    assert all(j.request_id == 8 for j in e.jobs.values())


def test_a_drop_frees_kv_kept_for_a_transfer_and_a_receiving_block_once_its_receive_ends() -> None:
    source = engine(hand_off=True)
    source.admit(block(7), call=1)
    report = source.step()
    assert report is not None and report.prefilled[0].handoff and source.ends.handed
    assert source.drop(7, before=2) == 1
    assert not source.ends.handed and not source.jobs and source.batcher.pool.num_free == 16

    destination = engine()
    events: list[TransferEvent] = []
    destination.emit = events.append
    job = destination.new_job(block(9), call=1)
    pages = tuple(destination.batcher.pool.allocate(job.req.id, pages_for(20 + BLOCK)))
    destination.jobs[job.req.id] = job
    destination.ends.receiving[3, 1] = job.req.id
    receive = destination.ends.receive_jobs[job.req.id] = TransferJob(3, 1, 9, 0, 0, pages)
    assert destination.drop(9, before=2) == 1
    assert destination.batcher.pool.num_free == 16 - len(pages)  # the link thread still writes into them
    assert receive.dropped.is_set()  # a receive still waiting for its peer stops waiting
    end = time.monotonic()
    destination.transfer_done(TransferResult(False, receive, 1, True, "", end, end, 0))
    assert destination.batcher.pool.num_free == 16 and not destination.jobs
    assert not destination.batcher.has_work and events[0].ok  # the event still goes out (stale there)


class RecordingLinks:
    """The links of a destination: what it asked to receive, and what it refused."""

    def __init__(self) -> None:
        self.received: list[TransferJob] = []
        self.refused: list[tuple[int, TransferJob]] = []

    def receive(self, peer: int, job: TransferJob) -> None:
        self.received.append(job)

    def refuse(self, peer: int, job: TransferJob) -> None:
        self.refused.append((peer, job))


def test_a_receive_refused_for_lack_of_pages_tells_its_sender_through_the_link() -> None:
    destination = engine(pages=2)  # a block of 20 + 32 tokens needs 4 pages
    events: list[TransferEvent] = []
    destination.emit = events.append
    links = RecordingLinks()
    destination.ends.links = links  # type: ignore[assignment]
    work = block(9)
    order = TransferOrder(
        TransferKind.RECEIVE, 3, 1, 9, 0, peer=5, pages=pages_for(20 + BLOCK), generation=2, tag=77,
        work=work, block_tokens=tuple(range(BLOCK)), step=1,
    )  # fmt: skip
    destination.transfer(order, call=1)
    assert len(events) == 1 and not events[0].ok and "no room for the KV" in events[0].error
    assert not links.received and len(links.refused) == 1
    peer, job = links.refused[0]
    assert (peer, job.transfer_id, job.attempt, job.tag, job.generation) == (5, 3, 1, 77, 2)
    assert "no room for the KV" in job.refused and destination.batcher.pool.num_free == 2


def test_the_logged_step_ends_once_its_report_is_assembled() -> None:
    """The iteration log's end - start is the whole step a profile times (`calib.profile_runner` times
    `Engine.step()`), the report's assembly included, so what follows to the next start is the worker
    loop's own (`calib.worker_loop`); the blocks end when their tokens are committed, before that."""
    e = engine()
    e.admit(block(1, forwards=1))
    assembling = e.batcher.complete

    def slow_complete(*args: Any, **kwargs: Any) -> Any:
        outcome = assembling(*args, **kwargs)
        time.sleep(0.05)  # a slow report's assembly, after the block's end is set
        return outcome

    e.batcher.complete = slow_complete  # type: ignore[method-assign]
    report = e.step()
    assert report is not None and len(report.finished) == 1
    assert report.stats.end - report.finished[0].end >= 0.05
