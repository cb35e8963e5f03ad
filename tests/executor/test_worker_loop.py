"""The worker loop hands an iteration's report to the sender once the next iteration's GPU work is queued."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from executor.control.messages import IterationReport, IterationStats
from executor.proto import sangam_pb2 as pb
from executor.worker.process import WorkerProcess


def stats(start: float) -> IterationStats:
    return IterationStats(0, start, start, 0, 0, 0, 0, 0, 0, 0.0, 0, 0)


class RecordingOutbox(queue.Queue[Any]):
    def __init__(self, log: list[tuple[str, int]]) -> None:
        super().__init__()
        self.log = log

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(item, IterationReport):
            self.log.append(("report out", int(item.gpu_s)))
        super().put(item, block, timeout)


class FakeEngine:
    """Runs `iterations` iterations; each calls `on_launch` midway, as `Engine.step` does."""

    def __init__(self, iterations: int, log: list[tuple[str, int]]) -> None:
        self.log, self.done, self.iterations = log, 0, iterations
        self.starts: list[float] = []
        self.batcher = SimpleNamespace(has_work=True, pool=SimpleNamespace(num_free=0))
        self.emit: Callable[[Any], None] = lambda event: None

    def step(self, on_launch: Callable[[], None]) -> IterationReport:
        index = self.done
        self.starts.append(time.monotonic())
        self.log.append(("launch", index))
        on_launch()
        time.sleep(0.005)  # the GPU work
        self.log.append(("results", index))
        self.done += 1
        self.batcher.has_work = self.done < self.iterations
        return IterationReport(stats(self.starts[-1]), gpu_s=index)


class FakeControl:
    def __init__(self) -> None:
        self.batches: list[pb.ReportBatch] = []

    def Report(self, message: pb.ReportBatch, timeout: float) -> None:
        self.batches.append(message)


def test_reports_go_out_at_the_next_launch_and_when_idle() -> None:
    log: list[tuple[str, int]] = []
    engine, control = FakeEngine(3, log), FakeControl()
    process = WorkerProcess(0, engine, control)  # type: ignore[arg-type]
    process.sender.outbox = RecordingOutbox(log)  # type: ignore[assignment]
    loop = threading.Thread(target=process.run)
    loop.start()
    for _ in range(200):
        if ("report out", 2) in log:
            break
        threading.Event().wait(0.01)
    process.stop("test over")
    loop.join(timeout=5)
    assert not loop.is_alive()
    assert log == [
        ("launch", 0), ("results", 0),
        ("launch", 1), ("report out", 0), ("results", 1),
        ("launch", 2), ("report out", 1), ("results", 2),
        ("report out", 2),  # nothing left to run: at once
    ]  # fmt: skip
    sent = [r for batch in control.batches for r in batch.iterations]
    assert [int(r.gpu_s) for r in sent] == [0, 1, 2]
    # an iteration followed straight on runs to the next start; the last, followed by waiting, has no cycle
    starts = engine.starts
    for report, start, following in zip(sent, starts, starts[1:], strict=False):
        assert 0.005 <= report.cycle_s <= following - start
    assert sent[2].cycle_s == 0.0
