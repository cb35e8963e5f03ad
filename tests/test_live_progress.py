"""`sangam live`'s progress: the watcher hears requests finished of the point's, those submitted and the
running mean end-to-end latency, polled at most once a second; a live replay on CPU ends on all done."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_helpers import replay, write_trace

from executor.live_tally import LiveTally, mean_e2e_s
from executor.proto import sangam_pb2 as pb
from sangam.tally import Tally


def record(arrival: float, end: float | None) -> pb.RequestRecord:
    block = pb.BlockTimes(ready=arrival) if end is None else pb.BlockTimes(ready=arrival, end=end)
    return pb.RequestRecord(arrival=arrival, blocks=[pb.BlockTimes(ready=arrival, end=arrival + 0.5), block])


class FakeClient:
    def __init__(self) -> None:
        self.done, self.records, self.calls = 0, [record(0.0, 2.0)], {"status": 0, "results": 0}

    def status(self) -> pb.StatusReply:
        self.calls["status"] += 1
        return pb.StatusReply(submitted=5, done=self.done, errors=1)

    def results(self) -> list[pb.RequestRecord]:
        self.calls["results"] += 1
        return self.records


def test_mean_e2e_is_over_finished_requests_only() -> None:
    assert mean_e2e_s([record(1.0, 4.0), record(2.0, 3.0), record(0.0, None)]) == 2.0
    assert mean_e2e_s([]) is None


def test_the_tally_polls_at_most_once_a_second_and_results_only_when_more_are_done() -> None:
    client, heard = FakeClient(), []
    tally = LiveTally(client, heard.append, total=10, every_s=3600)  # type: ignore[arg-type]
    tally.poll()
    tally.poll()  # too soon: nothing asked
    assert heard == [Tally(1, 10, "5 submitted, mean e2e 2.00 s")] and client.calls == {
        "status": 1,
        "results": 1,
    }
    tally.poll(final=True)  # done unchanged: no new results fetched
    client.done = 4
    tally.poll(final=True)
    assert heard[-1].done == 5 and client.calls == {"status": 3, "results": 2}


def test_a_live_replay_tells_its_watcher_up_to_every_request_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heard: list[Tally] = []

    @contextlib.contextmanager
    def watching(*_: Any) -> Iterator[Any]:
        yield heard.append

    monkeypatch.setattr("cli.progress.bar", watching)
    trace = write_trace(tmp_path / "trace.csv", 12, qps=4.0, prompt=(4, 40), output=(1, 64), seed=1)
    replay(["--workers", "1", "--trace", str(trace), "--mask-len", "64", "--log-dir", str(tmp_path / "logs")])
    assert heard and heard[-1].done == heard[-1].total == 12 and "12 submitted, mean e2e" in heard[-1].note
    assert [t.done for t in heard] == sorted(t.done for t in heard)
