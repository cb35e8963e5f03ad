"""A small Python client of a Sangam scheduler (`sangam live --serve` prints its address).

    with SangamClient("127.0.0.1:50051") as client:
        rid = client.submit([11, 42, 7], gen_len=64)
        for update in client.stream(rid):  # one update per finished block
            print(update.status, update.blocks_done, "/", update.n_blocks)
        print(client.poll(rid).token_ids)

With a server started with `--api-key KEY`, pass `SangamClient(address, api_key=KEY)`: every call then
carries `authorization: Bearer KEY`. Token ids only: the server does no tokenization. Bad input is not
an exception: the request ends with status ERROR and the reason in `error`. Every call has a deadline;
transport failures raise `SangamError`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from executor import codec, rpc
from executor.auth import metadata
from executor.messages import ClusterStatus, Submission, WorkerExit
from executor.proto import sangam_pb2 as pb
from executor.proto import sangam_pb2_grpc as pb_grpc

STREAM_TIMEOUT_S = 3600.0


class SangamError(RuntimeError):
    """A call to the scheduler failed (unreachable, refused, deadline exceeded); `code` is the gRPC
    status name where the async client knows it (UNAVAILABLE, RESOURCE_EXHAUSTED, ...)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class RequestResult:
    """A request's state: generated ids so far (whole committed blocks) and timing (server monotonic s)."""

    request_id: int
    status: str  # QUEUED, RUNNING, DONE, ERROR or NOT_FOUND
    error: str
    token_ids: tuple[int, ...]
    blocks_done: int
    n_blocks: int
    eos: bool  # generation stopped at an EOS before gen_len
    arrival: float
    end: float | None
    forwards: tuple[int, ...]  # forwards each finished block took
    queue_s: float = 0.0  # once DONE: latency parts summed over the blocks (executor.messages.RequestState)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    transfer_s: tuple[float, ...] = ()
    overflow_blocks: int = 0

    @property
    def finished(self) -> bool:
        return self.status in ("DONE", "ERROR", "NOT_FOUND")

    @staticmethod
    def of(state: pb.RequestState) -> RequestResult:
        return RequestResult(
            request_id=state.request_id,
            status=pb.RequestStatus.Name(state.status),
            error=state.error,
            token_ids=tuple(state.token_ids),
            blocks_done=state.blocks_done,
            n_blocks=state.n_blocks,
            eos=state.eos,
            arrival=state.arrival,
            end=state.end or None,
            forwards=tuple(state.forwards),
            queue_s=state.queue_s,
            prefill_s=state.prefill_s,
            decode_s=state.decode_s,
            transfer_s=tuple(state.transfer_s),
            overflow_blocks=state.overflow_blocks,
        )


class SangamClient:
    """A connection to one scheduler's client port; `api_key` is presented on every call."""

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
    ) -> pb.SubmitReply:
        """`submit`, returning the whole reply (status ERROR and the reason for bad input)."""
        sampling = pb.SamplingParams()
        if threshold is not None:
            sampling.threshold = threshold
        if temperature is not None:
            sampling.temperature = temperature
        if seed is not None:
            sampling.seed = seed
        message = pb.SubmitRequest(
            prompt_token_ids=list(prompt_ids),
            gen_len=gen_len,
            sampling=sampling,
            forwards=list(forwards or ()),
        )
        reply: pb.SubmitReply = self._call("Submit", self._stub.Submit, message)
        return reply

    def submit_future(self, message: pb.SubmitRequest) -> grpc.Future:
        """Send a prepared Submit without waiting; the future's result is a `SubmitReply`."""
        return self._stub.Submit.future(message, timeout=self.timeout)

    def poll(self, request_id: int) -> RequestResult:
        return RequestResult.of(self._call("Poll", self._stub.Poll, pb.RequestRef(request_id=request_id)))

    def stream(self, request_id: int, *, timeout: float = STREAM_TIMEOUT_S) -> Iterator[RequestResult]:
        """The current state, then one update per finished block, ending with DONE or ERROR."""
        call = self._stub.Stream(pb.RequestRef(request_id=request_id), timeout=timeout)
        try:
            for state in call:
                yield RequestResult.of(state)
        except grpc.RpcError as err:
            raise SangamError(f"{self.address}: Stream: {rpc.describe(err)}") from None
        finally:
            call.cancel()

    def wait(self, request_id: int, *, timeout: float = STREAM_TIMEOUT_S) -> RequestResult:
        """Block until the request is DONE or ERROR (or unknown); its final state."""
        for update in self.stream(request_id, timeout=timeout):
            if update.finished:
                return update
        result = self.poll(request_id)  # the stream ended early: the server is shutting down
        if result.finished:
            return result
        raise SangamError(f"{self.address}: request {request_id} still {result.status} when its stream ended")

    def status(self) -> pb.StatusReply:
        reply: pb.StatusReply = self._call("Status", self._stub.Status, pb.StatusRequest())
        return reply

    def results(self, first: int = 0) -> list[pb.RequestRecord]:
        """Timing records of every finished request, from the `first`-th on (in order of their end)."""
        reply = self._call(
            "Results", self._stub.Results, pb.ResultsRequest(first=first), timeout=max(self.timeout, 60.0)
        )
        return list(reply.requests)

    def wait_ready(self, timeout: float = 60.0) -> pb.StatusReply:
        """Wait until every worker has registered; SangamError on failure or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._stub.Status(
                    pb.StatusRequest(), timeout=min(self.timeout, 2.0), wait_for_ready=True
                )
            except grpc.RpcError as err:
                if time.monotonic() > deadline:
                    raise SangamError(f"{self.address}: not reachable: {rpc.describe(err)}") from None
            else:
                if reply.failure:
                    raise SangamError(reply.failure)
                if reply.ready:
                    return reply
                if time.monotonic() > deadline:
                    raise SangamError(
                        f"{self.address}: {reply.workers_registered} of {reply.workers_expected} workers "
                        f"registered after {timeout:g} s"
                    )
            time.sleep(0.05)

    def cancel(self, request_id: int) -> RequestResult:
        """End a queued or running request (its worker drops it); its state after the call."""
        return RequestResult.of(self._call("Cancel", self._stub.Cancel, pb.RequestRef(request_id=request_id)))

    def shutdown(self) -> None:
        """Ask the scheduler to stop every worker and itself."""
        self._call("Shutdown", self._stub.Shutdown, pb.ShutdownRequest())

    def _call(
        self, label: str, method: grpc.UnaryUnaryMultiCallable, message: object, timeout: float | None = None
    ) -> Any:
        try:
            return method(message, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise SangamError(f"{self.address}: {label}: {rpc.describe(err)}") from None


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

    async def submit(self, submission: Submission) -> RequestResult:
        """Queue a request: its first state (status ERROR and the reason for bad input)."""
        message = pb.SubmitRequest(
            prompt_token_ids=list(submission.prompt),
            gen_len=submission.gen_len,
            sampling=codec.sampling_to_pb(submission.sampling),
            forwards=list(submission.forwards),
        )
        reply = await self._call("Submit", self._stub.Submit(message, **self._options()))
        status = pb.RequestStatus.Name(reply.status)
        return RequestResult(reply.request_id, status, reply.error, (), 0, 0, False, 0.0, None, ())

    async def stream(self, request_id: int) -> AsyncIterator[RequestResult]:
        """The current state, then one update per finished block, ending with DONE or ERROR."""
        call = self._stub.Stream(
            pb.RequestRef(request_id=request_id), timeout=STREAM_TIMEOUT_S, metadata=self._metadata
        )
        try:
            async for state in call:
                yield RequestResult.of(state)
        except grpc.RpcError as err:
            raise SangamError(f"{self.address}: Stream: {rpc.describe(err)}", _code(err)) from None
        finally:
            call.cancel()

    async def cancel(self, request_id: int) -> RequestResult:
        state = await self._call(
            "Cancel", self._stub.Cancel(pb.RequestRef(request_id=request_id), **self._options())
        )
        return RequestResult.of(state)

    async def status(self) -> ClusterStatus:
        reply = await self._call("Status", self._stub.Status(pb.StatusRequest(), **self._options()))
        return codec.status_from_pb(reply)

    def _options(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "metadata": self._metadata}

    async def _call(self, label: str, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except grpc.RpcError as err:
            raise SangamError(f"{self.address}: {label}: {rpc.describe(err)}", _code(err)) from None


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
            codec.exit_to_pb(exit), timeout=timeout, metadata=metadata(secret)
        )
    except grpc.RpcError:
        return False
    finally:
        channel.close()
    return True
