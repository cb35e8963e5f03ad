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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from executor.control.client import AsyncSangamClient, SangamError, WatchStream
from executor.control.messages import ClusterStatus, RequestState, Submission

UNCLAIMED_S = 60.0  # how long a finished request's last state waits for a stream to follow it


class ShutDown(SangamError):
    """The server stopped following its requests: the drain's deadline came before they finished."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a request is validated against before it reaches the scheduler."""

    model: str  # the served model's name (`/v1/models`)
    vocab: int
    mask_id: int
    eos_ids: tuple[int, ...]
    mask_len: int  # the largest mask buffer (--mask-len): max_tokens fits it; a request's own is its
    # max_tokens in whole blocks (this one without max_tokens), and sizes its KV
    context_len: int  # prompt plus the request's mask buffer must fit
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
    """The scheduler as the app sees it (`executor.control.client.AsyncSangamClient`'s calls)."""

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

    One Watch stream, opened before the first request, carries every request's Submit and the updates
    of them all (`executor.control.scheduler_service`): no call per request, so no bound on the
    requests followed at once. A state may come before the Submit's answer that names its request, so the
    latest state of each request is kept until its stream has read it to the end; a finished one that
    no stream follows within `UNCLAIMED_S` is dropped (refused at Submit, or given up before it was
    followed). A Watch stream that ends once it was up means the scheduler is gone: every stream and
    every later Submit then raises `SangamError`. `cut` ends every stream, now and later, with `ShutDown`
    (the drain's deadline)."""

    def __init__(self, api_key: str | None = None) -> None:
        self.address = ""
        self.api_key = api_key
        self._client: AsyncSangamClient | None = None
        self._latest: dict[int, RequestState] = {}
        self._woken: dict[int, asyncio.Event] = {}  # the followed requests'
        self._unclaimed: dict[int, float] = {}  # finished requests no stream follows: since when
        self._stream: WatchStream | None = None
        self._watch: asyncio.Task[None] | None = None
        self._registered: asyncio.Future[None] | None = None  # done once the scheduler follows the Watch
        self._lost: SangamError | None = None  # why the Watch stream ended after it was up
        self._cut: ShutDown | None = None  # why the server stopped following its requests

    def _connected(self) -> AsyncSangamClient:
        if self._client is None:
            if not self.address:
                raise RuntimeError("the scheduler has not started")
            self._client = AsyncSangamClient(self.address, api_key=self.api_key)
        return self._client

    async def submit(self, submission: Submission) -> RequestState:
        stream = await self._watching()
        return await stream.submit(submission)

    async def stream(self, request_id: int) -> AsyncIterator[RequestState]:
        woken = self._woken.setdefault(request_id, asyncio.Event())
        self._unclaimed.pop(request_id, None)
        last: RequestState | None = None
        try:
            while True:
                if self._cut is not None:
                    raise self._cut
                state = self._latest.get(request_id)
                if state is not None and state is not last:
                    last = state
                    yield state
                    if state.finished:
                        return
                    continue
                if self._lost is not None:
                    raise self._lost
                woken.clear()
                await woken.wait()
        finally:
            self._woken.pop(request_id, None)
            self._latest.pop(request_id, None)

    async def cancel(self, request_id: int) -> None:
        await self._connected().cancel(request_id)

    def cut(self, reason: str) -> None:
        """End every request's stream with `ShutDown(reason)`, and every later one at once (in the
        event loop's thread)."""
        self._cut = ShutDown(reason)
        for woken in self._woken.values():
            woken.set()

    async def status(self) -> ClusterStatus:
        return await self._connected().status()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._client is not None:
            await self._client.close()

    async def _watching(self) -> WatchStream:
        """The Watch stream, opened unless it is open (again if it failed before it was up), once the
        scheduler follows it."""
        if self._lost is not None:
            raise self._lost
        if self._registered is None or (self._registered.done() and self._registered.exception()):
            self._registered = asyncio.get_running_loop().create_future()
            self._stream = self._connected().watch()
            self._watch = asyncio.create_task(self._follow(self._stream, self._registered))
        await asyncio.shield(self._registered)
        assert self._stream is not None
        return self._stream

    async def _follow(self, stream: WatchStream, registered: asyncio.Future[None]) -> None:
        try:
            async for states in stream.batches():
                if not registered.done():
                    registered.set_result(None)  # the first batch, empty: the scheduler follows it
                self._dispatch(states)
        except SangamError as err:
            if not registered.done():
                registered.set_exception(err)
                return
            self._lost = err
            for woken in self._woken.values():
                woken.set()

    def _dispatch(self, states: list[RequestState]) -> None:
        now = time.monotonic()
        for state in states:
            self._latest[state.request_id] = state
            woken = self._woken.get(state.request_id)
            if woken is not None:
                woken.set()
            elif state.finished:
                self._unclaimed[state.request_id] = now
        for rid, since in list(self._unclaimed.items()):
            if now - since > UNCLAIMED_S:
                del self._unclaimed[rid]
                self._latest.pop(rid, None)
