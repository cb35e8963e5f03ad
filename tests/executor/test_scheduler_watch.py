"""The scheduler's Watch: the states of watched requests, batched per stream, and only those."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest

from executor.control import codec, rpc
from executor.control.messages import (
    Registration,
    RequestState,
    RequestStatus,
    Submission,
    Submitted,
    WatchBatch,
)
from executor.control.scheduler_service import SchedulerCore, SchedulerServer, WatchCut
from executor.control.scheduler_state import SchedulerState
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc

PROMPT = tuple(range(1, 21))
Sent = queue.SimpleQueue[tuple[int, Submission] | None]


def sending(sent: Sent) -> Iterator[tuple[int, Submission]]:
    """A client's submits on its Watch: what `sent` gets, until None (the client stops sending)."""
    while (item := sent.get()) is not None:
        yield item


WORKER = Registration(0, "127.0.0.1:7000", 100, 1000, 999, (2,), "tiny", "cpu", 40, "colocated", 4096)


def test_a_watch_starts_empty_then_sends_what_queued_up_one_latest_state_per_request() -> None:
    core = SchedulerCore(1, mask_len=64, secret="s")
    open_: Sent = queue.SimpleQueue()
    try:
        first = core.watch(sending(open_), lambda: True)
        assert next(first) == WatchBatch([], [])  # registered: nothing published from now on is missed
        a0, b0 = RequestState(0, RequestStatus.QUEUED), RequestState(1, RequestStatus.QUEUED)
        a1 = RequestState(0, RequestStatus.RUNNING, blocks_done=1)
        for published in (a0, b0, a1):
            core.state.watch(published)
        second = core.watch(sending(open_), lambda: True)
        assert next(second) == WatchBatch([], [])
        b1 = RequestState(1, RequestStatus.DONE, blocks_done=1)
        core.state.watch(b1)
        assert next(first).states == [a1, b1]  # each request's latest state, once
        assert next(second).states == [b1]  # opened after the others were published
    finally:
        core.stop()
    assert list(first) == [] and list(second) == []  # a stopping scheduler ends them
    open_.put(None)
    open_.put(None)


def test_only_requests_submitted_with_watch_reach_it() -> None:
    seen: list[RequestState] = []
    state = SchedulerState(1, send=lambda worker, item: None, clock=lambda: 1.0, mask_len=64)
    state.watch = seen.append
    state.register(WORKER)
    watched = state.submit(Submission(PROMPT, 32, watch=True))
    state.submit(Submission(PROMPT, 32))  # not watched
    state.submit(Submission((), 32, watch=True))  # refused at Submit: its reply says so
    state.on_arrival(watched)
    assert [(s.request_id, s.status) for s in seen] == [
        (watched.id, RequestStatus.QUEUED),
        (watched.id, RequestStatus.RUNNING),
    ]


def test_submits_sent_on_a_watch_are_answered_on_it_under_their_tags() -> None:
    core = SchedulerCore(1, mask_len=64, secret="s")
    sent: Sent = queue.SimpleQueue()
    try:
        stream = core.watch(sending(sent), lambda: True)
        assert next(stream) == WatchBatch([], [])
        sent.put((7, Submission(PROMPT, 32)))  # no worker has registered
        assert next(stream) == WatchBatch([], [Submitted(7, None, "waiting for workers: 0 of 1 registered")])
        assert not core.register(codec.to_pb(WORKER)).error  # registered and linked: requests are taken
        sent.put((8, Submission((), 32)))  # refused at admission: an ERROR state, as a Submit's reply
        (answer,) = next(stream).submitted
        assert answer.tag == 8 and answer.state is not None and answer.state.status is RequestStatus.ERROR
        assert answer.state.error == "empty prompt"
        sent.put(None)  # the client stops sending: the stream ends
        assert list(stream) == []
    finally:
        core.stop()


def test_a_watch_that_falls_too_far_behind_is_cut_and_what_it_held_is_dropped() -> None:
    core = SchedulerCore(1, mask_len=64, secret="s", watch_backlog=10)
    sent: Sent = queue.SimpleQueue()
    try:
        stream = core.watch(sending(sent), lambda: True)
        assert next(stream) == WatchBatch([], [])  # then its client reads no more
        for rid in range(11):
            core.state.watch(RequestState(rid, RequestStatus.QUEUED))
        assert core._watchers == ()  # the 11th found 10 waiting: no more go to it
        with pytest.raises(WatchCut, match="fell 10 updates behind"):
            next(stream)  # nothing of what it held comes, only the cut
    finally:
        core.stop()
        sent.put(None)


def test_a_grpc_client_that_stops_reading_its_watch_is_cut_off_with_resource_exhausted() -> None:
    """Over a real socket: the client reads the first batch, then stops; the scheduler keeps publishing.
    Once gRPC's flow control holds the stream's sender, its queue fills to the bound and it is cut: the
    client, reading again, gets what was in flight, then RESOURCE_EXHAUSTED."""
    core = SchedulerCore(1, mask_len=64, secret="s", watch_backlog=200)
    server = SchedulerServer(core)
    server.start()
    channel = rpc.channel(server.address)
    sending_done = threading.Event()

    def requests() -> Iterator[pb.WatchRequest]:  # sends nothing, and does not stop sending
        sending_done.wait()
        yield from ()

    try:
        stream = pb_grpc.SchedulerStub(channel).Watch(requests())
        next(stream)  # registered
        tokens = tuple(range(2000))
        published = 0
        while core._watchers:
            assert published < 200_000, "the stream was buffered without a bound"
            core.state.watch(RequestState(published, RequestStatus.RUNNING, token_ids=tokens))
            published += 1
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stream:
                pass
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "fell 200 updates behind" in (caught.value.details() or "")
    finally:
        sending_done.set()
        channel.close()
        server.stop()
