"""`ClusterBackend` over a scheduler that answers like the real one can: a request's updates on the Watch
stream before the Submit reply that names it, and a Watch stream that ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from executor.control.client import SangamError
from executor.control.messages import RequestState, RequestStatus, Submission
from serve.backend import ClusterBackend


class Scheduler:
    """The `AsyncSangamClient` and `WatchStream` calls the backend makes; a Submit's states go out on the
    Watch first, its answer after; a request of one block finishes, a longer one stays QUEUED."""

    def __init__(self) -> None:
        self.published: asyncio.Queue[list[RequestState] | None] = asyncio.Queue()
        self.watches = 0
        self.ids = 0

    def watch(self) -> Scheduler:
        self.watches += 1
        return self

    async def batches(self) -> AsyncIterator[list[RequestState]]:
        yield []
        while (batch := await self.published.get()) is not None:
            yield batch
        raise SangamError("the scheduler ended the stream")

    async def submit(self, submission: Submission) -> RequestState:
        rid, self.ids = self.ids, self.ids + 1
        await self.published.put([RequestState(rid, RequestStatus.QUEUED, n_blocks=1)])
        if submission.gen_len == 32:
            await self.published.put([RequestState(rid, RequestStatus.DONE, blocks_done=1, n_blocks=1)])
        for _ in range(5):
            await asyncio.sleep(0)  # the Watch delivers them before this reply
        return RequestState(rid, RequestStatus.QUEUED, n_blocks=1)


def backend_over(scheduler: Scheduler) -> ClusterBackend:
    backend = ClusterBackend()
    backend._client = scheduler  # type: ignore[assignment]
    return backend


def test_states_that_come_before_the_submit_reply_are_not_lost() -> None:
    async def run() -> list[RequestStatus]:
        scheduler = Scheduler()
        backend = backend_over(scheduler)
        rids = [(await backend.submit(Submission((1, 2), 32))).request_id for _ in range(3)]
        streams = [[s.status async for s in backend.stream(rid)] for rid in rids]
        assert scheduler.watches == 1  # one stream follows them all
        return [statuses[-1] for statuses in streams]

    assert asyncio.run(asyncio.wait_for(run(), 10)) == [RequestStatus.DONE] * 3


def test_a_watch_that_ends_fails_its_followers_and_later_submits() -> None:
    async def run() -> None:
        scheduler = Scheduler()
        backend = backend_over(scheduler)
        running = await backend.submit(Submission((1, 2), 64))  # stays QUEUED
        updates = backend.stream(running.request_id)
        assert (await anext(updates)).status is RequestStatus.QUEUED
        await scheduler.published.put(None)  # the scheduler ends the Watch
        with pytest.raises(SangamError, match="ended the stream"):
            await anext(updates)
        with pytest.raises(SangamError, match="ended the stream"):
            await backend.submit(Submission((1, 2), 32))

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_finished_request_no_stream_follows_is_forgotten_after_the_unclaimed_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused at Submit, or given up before a stream followed it: its last state must not stay forever."""
    monkeypatch.setattr("serve.backend.UNCLAIMED_S", -1.0)  # any wait at all is too long

    async def run() -> None:
        scheduler = Scheduler()
        backend = backend_over(scheduler)
        followed = await backend.submit(Submission((1, 2), 64))  # stays QUEUED
        updates = backend.stream(followed.request_id)
        assert (await anext(updates)).status is RequestStatus.QUEUED
        abandoned = await backend.submit(Submission((1, 2), 32))  # ends on the Watch, nobody streams it
        await scheduler.published.put([RequestState(followed.request_id, RequestStatus.RUNNING, n_blocks=2)])
        assert (await anext(updates)).status is RequestStatus.RUNNING
        assert abandoned.request_id not in backend._latest and followed.request_id in backend._latest

    asyncio.run(asyncio.wait_for(run(), 10))
