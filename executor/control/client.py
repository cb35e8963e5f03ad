"""A small Python client of a Sangam scheduler (`sangam live --serve` prints its address).

    with SangamClient("127.0.0.1:50051") as client:
        rid = client.submit([11, 42, 7], gen_len=64)
        for update in client.stream(rid):  # one update per finished block
            print(update.status, update.blocks_done, "/", update.n_blocks)
        print(client.poll(rid).token_ids)

With a server started with `--api-key KEY`, pass `SangamClient(address, api_key=KEY)`: every call then
carries `authorization: Bearer KEY`. Token ids only: the server does no tokenization. Bad input is not
an exception: the request ends with status ERROR and the reason in `error`. Every call has a deadline;
transport failures raise `SangamError`. Protobuf stays in `executor.control.codec`: the client sends and
returns typed values.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from executor.control import codec, rpc
from executor.control.auth import metadata
from executor.control.messages import (
    ClusterStatus,
    RequestState,
    Sampling,
    Submission,
    WatchBatch,
    WorkerExit,
)
from executor.proto import sangam_pb2_grpc as pb_grpc
from sangam.request import Request

STREAM_TIMEOUT_S = 3600.0
POLL_INTERVAL_S = 0.1  # `wait` polls at this pace when the server has no stream to spare


class SangamError(RuntimeError):
    """A call to the scheduler failed (unreachable, refused, deadline exceeded); `code` is the gRPC
    status name (UNAVAILABLE, UNAUTHENTICATED, RESOURCE_EXHAUSTED, ...) when the call got one."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class SangamClient:
    """A connection to one scheduler's client port; `api_key` is presented on every call. Results are
    `executor.control.messages` values (`RequestState`, `ClusterStatus`) and finished
    `sangam.request.Request`s."""

    def __init__(
        self, address: str, *, api_key: str | None = None, timeout: float = rpc.CALL_TIMEOUT_S
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = rpc.channel(address, api_key)
        self._stub = pb_grpc.SchedulerStub(self._channel)

    def __enter__(self) -> SangamClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def submit(
        self,
        prompt_ids: Sequence[int],
        gen_len: int,
        *,
        forwards: Sequence[int] | None = None,
        threshold: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> int:
        """Queue a request and return its id; `forwards` forces each block's number of forwards."""
        return self.submit_reply(
            prompt_ids, gen_len, forwards=forwards, threshold=threshold, temperature=temperature, seed=seed
        ).request_id

    def submit_reply(
        self,
        prompt_ids: Sequence[int],
        gen_len: int,
        *,
        forwards: Sequence[int] | None = None,
        threshold: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> RequestState:
        """`submit`, returning the request's first state (status ERROR and the reason for bad input)."""
        submission = Submission(
            tuple(prompt_ids), gen_len, Sampling(threshold, temperature, seed), tuple(forwards or ())
        )
        reply = self._call("Submit", self._stub.Submit, codec.to_pb(submission))
        return codec.submit_reply_from_pb(reply)

    def submit_future(self, submission: Submission) -> Future[RequestState]:
        """Send a Submit without waiting; the future's result is the request's first state, or a
        `SangamError`."""
        out: Future[RequestState] = Future()
        call = self._stub.Submit.future(codec.to_pb(submission), timeout=self.timeout)

        def done(call: grpc.Future) -> None:
            try:
                out.set_result(codec.submit_reply_from_pb(call.result()))
            except grpc.RpcError as err:
                out.set_exception(self._error("Submit", err))

        call.add_done_callback(done)
        return out

    def poll(self, request_id: int) -> RequestState:
        return codec.from_pb(self._call("Poll", self._stub.Poll, codec.request_ref(request_id)), RequestState)

    def stream(self, request_id: int, *, timeout: float = STREAM_TIMEOUT_S) -> Iterator[RequestState]:
        """The current state, then one update per finished block, ending with DONE or ERROR. When the
        server has no stream to spare (RESOURCE_EXHAUSTED), the same updates come from polling."""
        call = self._stub.Stream(codec.request_ref(request_id), timeout=timeout)
        try:
            for state in call:
                yield codec.from_pb(state, RequestState)
            return
        except grpc.RpcError as err:
            if _code(err) != grpc.StatusCode.RESOURCE_EXHAUSTED.name:
                raise self._error("Stream", err) from None
        finally:
            call.cancel()
        deadline = time.monotonic() + timeout
        last: RequestState | None = None
        while last is None or not last.finished:
            state = self.poll(request_id)
            if state != last:
                yield state
                last = state
            if time.monotonic() > deadline:
                raise SangamError(
                    f"{self.address}: Stream: request {request_id} unfinished after {timeout:g} s"
                )
            time.sleep(POLL_INTERVAL_S)

    def wait(self, request_id: int, *, timeout: float = STREAM_TIMEOUT_S) -> RequestState:
        """Block until the request is DONE or ERROR (or unknown); its final state."""
        for update in self.stream(request_id, timeout=timeout):
            if update.finished:
                return update
        result = self.poll(request_id)  # the stream ended early: the server is shutting down
        if result.finished:
            return result
        raise SangamError(f"{self.address}: request {request_id} still {result.status} when its stream ended")

    def status(self) -> ClusterStatus:
        return codec.from_pb(self._call("Status", self._stub.Status, codec.status_request()), ClusterStatus)

    def results(self, first: int = 0) -> list[Request]:
        """Every finished request from the `first`-th on (in order of their end), times in the
        scheduler's clock (`executor.run.live.rebuild` moves them to the run's origin)."""
        reply = self._call(
            "Results", self._stub.Results, codec.results_request(first), timeout=max(self.timeout, 60)
        )
        return [codec.request_from_record(record) for record in reply.requests]

    def wait_ready(self, timeout: float = 60.0) -> ClusterStatus:
        """Wait until every worker has registered; SangamError on failure or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._stub.Status(
                    codec.status_request(), timeout=min(self.timeout, 2.0), wait_for_ready=True
                )
            except grpc.RpcError as err:
                if time.monotonic() > deadline:
                    raise SangamError(
                        f"{self.address}: not reachable: {rpc.describe(err)}", err.code().name
                    ) from None
            else:
                status = codec.from_pb(reply, ClusterStatus)
                if status.failure:
                    raise SangamError(status.failure)
                if status.ready:
                    return status
                if time.monotonic() > deadline:
                    raise SangamError(
                        f"{self.address}: {status.workers_registered} of {status.workers_expected} workers "
                        f"registered after {timeout:g} s"
                    )
            time.sleep(0.05)

    def cancel(self, request_id: int) -> RequestState:
        """End a queued or running request (its worker drops it); its state after the call."""
        state = self._call("Cancel", self._stub.Cancel, codec.request_ref(request_id))
        return codec.from_pb(state, RequestState)

    def shutdown(self) -> None:
        """Ask the scheduler to stop every worker and itself (needs the api key, if the server has one)."""
        self._call("Shutdown", self._stub.Shutdown, codec.shutdown_request())

    def _call(
        self, label: str, method: Callable[..., Any], message: object, timeout: float | None = None
    ) -> Any:
        try:
            return method(message, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise self._error(label, err) from None

    def _error(self, label: str, err: grpc.RpcError) -> SangamError:
        return SangamError(f"{self.address}: {label}: {rpc.describe(err)}", _code(err))


class AsyncSangamClient:
    """The calls an asyncio server makes (`serve.backend`), over a `grpc.aio` channel: no thread is
    parked per request. Transport failures raise `SangamError`, whose `code` is the gRPC status name."""

    def __init__(
        self, address: str, *, api_key: str | None = None, timeout: float = rpc.CALL_TIMEOUT_S
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._metadata = metadata(api_key)  # on every call
        self._channel = grpc.aio.insecure_channel(address, options=rpc.CHANNEL_OPTIONS)
        self._stub = pb_grpc.SchedulerStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def submit(self, submission: Submission) -> RequestState:
        """Queue a request: its first state (status ERROR and the reason for bad input)."""
        message = codec.to_pb(submission)
        reply = await self._call("Submit", self._stub.Submit(message, **self._options()))
        return codec.submit_reply_from_pb(reply)

    async def stream(self, request_id: int) -> AsyncIterator[RequestState]:
        """The current state, then one update per finished block, ending with DONE or ERROR. When the
        server has no stream to spare (RESOURCE_EXHAUSTED), the same updates come from polling."""
        call = self._stub.Stream(
            codec.request_ref(request_id), timeout=STREAM_TIMEOUT_S, metadata=self._metadata
        )
        try:
            async for state in call:
                yield codec.from_pb(state, RequestState)
            return
        except grpc.RpcError as err:
            if _code(err) != grpc.StatusCode.RESOURCE_EXHAUSTED.name:
                raise SangamError(f"{self.address}: Stream: {rpc.describe(err)}", _code(err)) from None
        finally:
            call.cancel()
        last: RequestState | None = None
        while last is None or not last.finished:
            state = await self.poll(request_id)
            if state != last:
                yield state
                last = state
            await asyncio.sleep(POLL_INTERVAL_S)

    def watch(self) -> WatchStream:
        """A Watch stream: requests submitted on it, and the updates of every request submitted with
        `watch` set from the call on."""
        return WatchStream(self._stub.Watch(metadata=self._metadata), self.address, self.timeout, self.cancel)

    async def poll(self, request_id: int) -> RequestState:
        state = await self._call("Poll", self._stub.Poll(codec.request_ref(request_id), **self._options()))
        return codec.from_pb(state, RequestState)

    async def cancel(self, request_id: int) -> RequestState:
        state = await self._call(
            "Cancel", self._stub.Cancel(codec.request_ref(request_id), **self._options())
        )
        return codec.from_pb(state, RequestState)

    async def status(self) -> ClusterStatus:
        reply = await self._call("Status", self._stub.Status(codec.status_request(), **self._options()))
        return codec.from_pb(reply, ClusterStatus)

    def _options(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "metadata": self._metadata}

    async def _call(self, label: str, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except grpc.RpcError as err:
            raise SangamError(f"{self.address}: {label}: {rpc.describe(err)}", _code(err)) from None


class WatchStream:
    """One Watch call (no deadline: it lasts as long as the client wants). `submit` sends a request on it
    and waits up to `timeout` for its answer, which `batches` reads: nothing is answered while no task
    reads them. A request answered after its caller gave up (timed out, or cancelled) is accepted with
    nobody to follow it, so it is given up at the scheduler with `cancel`."""

    def __init__(
        self, call: Any, address: str, timeout: float, cancel: Callable[[int], Awaitable[object]]
    ) -> None:
        self.address = address
        self.timeout = timeout
        self._call = call
        self._cancel = cancel
        self._tags = itertools.count(1)
        self._answers: dict[int, asyncio.Future[RequestState]] = {}
        self._writing = asyncio.Lock()  # one message at a time on the stream
        self._ended: SangamError | None = None
        self._cancels: set[asyncio.Task[None]] = set()

    async def submit(self, submission: Submission) -> RequestState:
        """Queue a request (as watched): its first state (status ERROR and the reason for bad input);
        `SangamError` with code UNAVAILABLE when the scheduler takes none now or the stream ended, and
        DEADLINE_EXCEEDED when no answer came in time."""
        if self._ended is not None:
            raise self._ended
        tag = next(self._tags)
        answer = self._answers[tag] = asyncio.get_running_loop().create_future()
        try:
            # shielded: grpc.aio cancels the whole call when a write is cancelled
            await asyncio.shield(self._send(codec.watch_submit(tag, submission)))
            return await asyncio.wait_for(asyncio.shield(answer), self.timeout)
        except TimeoutError:
            raise SangamError(
                f"{self.address}: Submit: no answer within {self.timeout:g} s", "DEADLINE_EXCEEDED"
            ) from None
        finally:
            self._answers.pop(tag, None)

    async def _send(self, message: Any) -> None:
        async with self._writing:
            try:
                await self._call.write(message)
            except (grpc.RpcError, asyncio.InvalidStateError) as err:  # the call is over
                raise self._ended or SangamError(f"{self.address}: Watch: {err}", "UNAVAILABLE") from None

    def _give_up(self, request_id: int) -> None:
        async def cancel() -> None:
            with contextlib.suppress(SangamError):  # the scheduler is gone: so is the request
                await self._cancel(request_id)

        task = asyncio.get_running_loop().create_task(cancel())
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def batches(self) -> AsyncIterator[list[RequestState]]:
        """The updates of every watched request, in batches (the latest state of each that changed); an
        empty batch first, once the scheduler follows the stream. Ends when the scheduler stops."""
        try:
            async for message in self._call:
                batch = codec.from_pb(message, WatchBatch)
                for submitted in batch.submitted:
                    answer = self._answers.get(submitted.tag)
                    if answer is None or answer.done():  # its caller gave up
                        if submitted.state is not None and not submitted.state.finished:
                            self._give_up(submitted.state.request_id)
                        continue
                    if submitted.state is None:
                        answer.set_exception(
                            SangamError(f"{self.address}: Submit: {submitted.unavailable}", "UNAVAILABLE")
                        )
                    else:
                        answer.set_result(submitted.state)
                yield batch.states
            self._end(SangamError(f"{self.address}: Watch: the scheduler ended the stream", "UNAVAILABLE"))
        except grpc.RpcError as err:
            self._end(SangamError(f"{self.address}: Watch: {rpc.describe(err)}", _code(err)))
        finally:
            self._call.cancel()
            self._end(SangamError(f"{self.address}: Watch: the stream was closed", "CANCELLED"))
        assert self._ended is not None
        raise self._ended

    def _end(self, err: SangamError) -> None:
        """The stream is over: every Submit waiting for its answer, and every later one, raises `err`."""
        if self._ended is not None:
            return
        self._ended = err
        for answer in self._answers.values():
            if not answer.done():
                answer.set_exception(err)


def _code(err: grpc.RpcError) -> str:
    code = getattr(err, "code", None)  # grpc.Call and grpc.aio.AioRpcError
    return code().name if callable(code) else ""


def report_worker_exit(
    control: str, exit: WorkerExit, secret: str, timeout: float = rpc.CALL_TIMEOUT_S
) -> bool:
    """Tell the scheduler's Control port (`control`) that a worker's process ended (the launcher does,
    with the run's `secret`); False if the scheduler could not be told."""
    channel = rpc.channel(control)
    try:
        pb_grpc.ControlStub(channel).WorkerExited(
            codec.to_pb(exit), timeout=timeout, metadata=metadata(secret)
        )
    except grpc.RpcError:
        return False
    finally:
        channel.close()
    return True
