"""The bridge from the HTTP app to a running scheduler (`ClusterBackend`), behind the small `Backend`
interface the app is written against, so that tests can also drive the app with a fake.

`ServingState` is what the app knows of the cluster: nothing while it starts (every request gets 503),
then the model's limits once every worker has registered, a failure if a process died, and whether a
SIGTERM has begun the drain. The requests in flight are counted here too (for the gauges, `--max-waiting`
and the drain).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from executor.client import AsyncSangamClient
from executor.messages import ClusterStatus, RequestState, Submission

STREAMS = 96  # Streams open at once, below the scheduler's bounds per connection (128) and in all (192)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request is validated against before it reaches the scheduler."""

    model: str  # the served model's name (`/v1/models`)
    vocab: int
    mask_id: int
    eos_ids: tuple[int, ...]
    mask_len: int  # the mask buffer: max_tokens fits it, and every request's KV is sized by it
    context_len: int  # prompt plus mask buffer must fit
    pages: int  # KV pages of the smallest worker


@dataclass(slots=True)
class ServingState:
    limits: Limits | None = None  # None until every worker has registered
    failure: str = ""  # why the cluster cannot serve (a process died)
    draining: bool = False
    requests: dict[int, str] = field(default_factory=dict)  # scheduler id -> QUEUED or RUNNING
    admitting: int = 0  # requests between their checks and their Submit reply
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def unavailable(self) -> str | None:
        """Why a request cannot be taken now (503), or None."""
        if self.failure:
            return f"the server cannot serve: {self.failure}"
        if self.draining:
            return "the server is shutting down"
        if self.limits is None:
            return "the server is starting: workers are not ready yet"
        return None

    @property
    def waiting(self) -> int:
        return self.admitting + sum(status == "QUEUED" for status in list(self.requests.values()))

    @property
    def running(self) -> int:
        return sum(status == "RUNNING" for status in list(self.requests.values()))

    @property
    def in_flight(self) -> int:
        return self.admitting + len(self.requests)


class Backend(Protocol):
    """The scheduler as the app sees it (`executor.client.AsyncSangamClient`'s calls)."""

    async def submit(self, submission: Submission) -> RequestState:
        """Queue a request: its first state (ERROR and the reason when the scheduler refuses it)."""

    def stream(self, request_id: int) -> AsyncIterator[RequestState]:
        """The request's state, then one update per finished block, until DONE or ERROR."""

    async def cancel(self, request_id: int) -> None:
        """Give the request up: it leaves the queue, its worker drops it."""

    async def status(self) -> ClusterStatus: ...


class ClusterBackend:
    """`Backend` over the scheduler's client port; the address is set once the cluster is up, and the
    asyncio channel is opened on first use, inside the server's event loop.

    The scheduler bounds the Streams one client connection may hold open (`executor.scheduler`,
    `CLIENT_STREAMS_PER_PEER`), so at most `STREAMS` requests are streamed at once; a request beyond
    that waits for a slot (it is queued or running at the scheduler meanwhile, and the stream it then
    opens starts with every block it has finished, which the app still sends one chunk per block)."""

    def __init__(self, api_key: str | None = None) -> None:
        self.address = ""
        self.api_key = api_key
        self._client: AsyncSangamClient | None = None
        self._streams = asyncio.Semaphore(STREAMS)

    def _connected(self) -> AsyncSangamClient:
        if self._client is None:
            if not self.address:
                raise RuntimeError("the scheduler has not started")
            self._client = AsyncSangamClient(self.address, api_key=self.api_key)
        return self._client

    async def submit(self, submission: Submission) -> RequestState:
        return await self._connected().submit(submission)

    async def stream(self, request_id: int) -> AsyncIterator[RequestState]:
        async with self._streams:
            async for update in self._connected().stream(request_id):
                yield update

    async def cancel(self, request_id: int) -> None:
        await self._connected().cancel(request_id)

    async def status(self) -> ClusterStatus:
        return await self._connected().status()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
