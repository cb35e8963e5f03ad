"""A client's cancel at the scheduler: exact work sent out and states read, for a queued and a running
request (no gRPC, no threads)."""

from __future__ import annotations

from test_scheduler_state import PROMPT, registration, state, stats

from executor.control.messages import (
    BlockWork,
    DropOrder,
    IterationReport,
    Prefilled,
    ReportBatch,
    RequestStatus,
    Submission,
)
from executor.control.scheduler_state import CANCELLED


def test_a_running_request_is_dropped_on_its_worker_and_its_charge_released() -> None:
    core, sent = state("colocated", 1)
    core.register(registration(0))
    running = core.submit(Submission(PROMPT, gen_len=64, forwards=(3, 3)))
    core.on_arrival(running)
    report = IterationReport(stats(0), 0.1, prefilled=(Prefilled(0, 0, 101.0, 102.0),))
    core.on_batch(ReportBatch(0, (report,)))
    assert sent == [(0, BlockWork(0, 100.0, 0, 20, 64, PROMPT, 3))]
    core.cancel(running.id)
    assert sent[1:] == [(0, DropOrder(0))]
    assert running.state.status is RequestStatus.ERROR and running.state.error == CANCELLED
    assert (core.errors, core.done) == (1, 0)
    assert core.router is not None and core.router.outstanding == [0]
    core.cancel(running.id)  # again: nothing more happens
    assert len(sent) == 2 and core.errors == 1


def test_a_queued_request_leaves_the_queue_without_reaching_a_worker() -> None:
    core, sent = state("1P1D", 2)
    core.register(registration(0, "prefill"))
    core.register(registration(1, "decode"))
    big = core.submit(Submission(PROMPT * 4, gen_len=32, forwards=(3,), mask_len=64))  # 80 + 64: 9 pages
    waiting = [core.submit(Submission(PROMPT * 4, gen_len=32, forwards=(3,), mask_len=64)) for _ in range(12)]
    for tracked in (big, *waiting):
        core.on_arrival(tracked)
    dispatched = {item.request_id for _, item in sent if isinstance(item, BlockWork)}
    last = waiting[-1]
    assert last.id not in dispatched and last.state.status is RequestStatus.QUEUED
    before = len(sent)
    core.cancel(last.id)
    assert len(sent) == before  # no worker held it: nothing to drop
    assert last.state.status is RequestStatus.ERROR and last.state.error == CANCELLED
    assert core.router is not None and core.router.num_pending == 12 - len(dispatched)
