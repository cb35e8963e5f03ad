"""`Engine.step` against a KV link thread that holds the engine's lock (CPU, tiny model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from executor.attention import TorchAttention
from executor.engine import Engine
from executor.forward import ModelRunner
from executor.kv_cache import PagedKVCache
from executor.kv_transfer import TransferJob, TransferResult
from executor.messages import BlockWork, TransferEvent, TransferKind
from executor.models import Family, random_model, tiny
from sangam.batcher import BatchConfig, Batcher
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
    job = engine._job(work)  # as `_receive` registers it: pages allocated, resuming at step 1
    job.req.step = 1
    pages = tuple(pool.allocate(job.req.id, pages_for(prompt + BLOCK)))
    engine.jobs[job.req.id] = job
    engine.receiving[3, 1] = job.req.id

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
