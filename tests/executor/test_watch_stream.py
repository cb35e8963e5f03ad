"""`WatchStream`, the client side of a bidirectional Watch, over a fake call: Submits answered under their
tags, a Submit no answer reaches in time, and a request answered after its caller gave up; how a grpc.aio
call's failure is described."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from executor.control import codec, rpc
from executor.control.client import SangamError, WatchStream
from executor.control.messages import RequestState, RequestStatus, Submission, Submitted, WatchBatch
from executor.proto import sangam_pb2 as pb


class FakeCall:
    """The grpc.aio call's side of it: what was written, and the batches put on `replies` (None ends)."""

    def __init__(self) -> None:
        self.sent: list[pb.WatchRequest] = []
        self.replies: asyncio.Queue[pb.StateBatch | None] = asyncio.Queue()

    async def write(self, message: pb.WatchRequest) -> None:
        self.sent.append(message)

    async def _read(self) -> AsyncIterator[pb.StateBatch]:
        while (message := await self.replies.get()) is not None:
            yield message

    def __aiter__(self) -> AsyncIterator[pb.StateBatch]:
        return self._read()

    def cancel(self) -> None:
        pass

    async def answer(self, tag: int, request_id: int) -> None:
        state = RequestState(request_id, RequestStatus.QUEUED)
        await self.replies.put(codec.to_pb(WatchBatch([], [Submitted(tag, state)])))


async def settle(done: object) -> None:
    for _ in range(100):
        if done():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def test_a_submit_no_answer_reaches_times_out_and_its_late_acceptance_is_cancelled() -> None:
    async def run() -> None:
        call, cancelled = FakeCall(), []

        async def cancel(request_id: int) -> None:
            cancelled.append(request_id)

        stream = WatchStream(call, "scheduler", 0.2, cancel)

        async def follow() -> None:
            async for _ in stream.batches():
                pass

        reading = asyncio.ensure_future(follow())
        with pytest.raises(SangamError) as late:
            await stream.submit(Submission((1, 2), 32))
        assert late.value.code == "DEADLINE_EXCEEDED" and len(call.sent) == 1
        answered = asyncio.ensure_future(stream.submit(Submission((3, 4), 32)))
        await settle(lambda: len(call.sent) == 2)
        await call.answer(call.sent[0].tag, 5)  # the first, accepted after its caller gave up
        await call.answer(call.sent[1].tag, 6)
        assert (await answered).request_id == 6
        await settle(lambda: cancelled == [5])
        reading.cancel()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_an_aio_call_error_is_described_by_its_code_and_first_line() -> None:
    err = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="refused\nmore"
    )
    assert rpc.describe(err) == "UNAVAILABLE: refused"
