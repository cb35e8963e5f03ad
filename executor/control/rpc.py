"""gRPC plumbing shared by the scheduler, the workers, the client and the launcher.

Every RPC made here carries a deadline; servers bind fail-fast (no port reuse) and cap message sizes.
A channel may present a bearer token on every call (`executor.control.auth`). Every server answers undecodable
request bytes with INVALID_ARGUMENT (`Undecodable`) instead of gRPC's INTERNAL and logged traceback, and
may bound its open server streams (`StreamLimit`), so that parked streams cannot take every thread.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any, NamedTuple

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from executor.control.auth import metadata

MAX_MESSAGE_BYTES = 64 << 20
CALL_TIMEOUT_S = 10.0  # default deadline of a unary control-plane call
HEALTH_TIMEOUT_S = 2.0

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def channel(address: str, token: str | None = None) -> grpc.Channel:
    """An insecure channel to `address` (host:port) with Sangam's message limits; with a `token`, every
    call on it presents `authorization: Bearer token`."""
    raw = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    return raw if token is None else grpc.intercept_channel(raw, _Credential(metadata(token)))


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _Credential(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamStreamClientInterceptor
):
    """Adds fixed metadata (the bearer token) to every call of a channel."""

    def __init__(self, extra: Sequence[tuple[str, str]]) -> None:
        self.extra = tuple(extra)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        d: Any = details
        given = tuple(d.metadata or ())
        return _CallDetails(
            d.method, d.timeout, (*given, *self.extra), d.credentials, d.wait_for_ready, d.compression
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, requests: Any) -> Any:
        return continuation(self._details(client_call_details), requests)


def server(
    threads: int,
    max_concurrent_rpcs: int | None = None,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> grpc.Server:
    """A thread-pool server; `so_reuseport` off so that binding a taken port fails at once. The
    `interceptors` see each call first (an `executor.control.auth.Guard`, a `StreamLimit`), then undecodable
    requests are answered INVALID_ARGUMENT."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        interceptors=[*interceptors, Undecodable()],
        options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )


_UNDECODABLE = object()  # what a request that failed to decode is replaced with


class Undecodable(grpc.ServerInterceptor):
    """Answers a request whose bytes do not decode with INVALID_ARGUMENT (one line in the log), instead
    of gRPC's default: INTERNAL and a traceback in the server's log."""

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        if handler.request_streaming and not handler.response_streaming:
            return handler  # no such method
        decode = handler.request_deserializer
        method = handler_call_details.method
        log = logging.getLogger("sangam.rpc")

        def request(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception:  # protobuf's DecodeError, or anything else a bad payload raises
                return _UNDECODABLE

        def checked(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
            def call(message: Any, context: grpc.ServicerContext) -> Any:
                if message is _UNDECODABLE:
                    log.warning("undecodable %s request from %s", method, context.peer())
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the request does not decode")
                return behavior(message, context)

            return call

        def streaming(behavior: Callable[[Iterator[Any], grpc.ServicerContext], Any]) -> Any:
            def call(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                def decoded() -> Iterator[Any]:
                    """The requests up to an undecodable one, which sets the call's status: its handler
                    hears the request stream end (it may read it on a thread of its own)."""
                    for message in requests:
                        if message is _UNDECODABLE:
                            log.warning("undecodable %s request from %s", method, context.peer())
                            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                            context.set_details(f"{method}: the request does not decode")
                            return
                        yield message

                return behavior(decoded(), context)

            return call

        serialize = handler.response_serializer
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), request, serialize)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(checked(handler.unary_stream), request, serialize)
        return grpc.unary_unary_rpc_method_handler(checked(handler.unary_unary), request, serialize)


class StreamLimit(grpc.ServerInterceptor):
    """Bounds the server streams open at once, in all and per peer (one client connection): a stream
    beyond either bound ends at once with RESOURCE_EXHAUSTED, so that a thread-pool server sized above
    `total` always has threads left for its unary calls."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not handler.response_streaming:
            return handler
        behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream

        def limited(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            """`request`: the message, or the iterator of them of a bidirectional stream."""
            peer = context.peer()
            refusal = self._enter(peer)
            if refusal is not None:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
            try:
                yield from behavior(request, context)
            finally:
                self._leave(peer)

        build = (
            grpc.stream_stream_rpc_method_handler
            if handler.request_streaming
            else grpc.unary_stream_rpc_method_handler
        )
        return build(limited, handler.request_deserializer, handler.response_serializer)

    def _enter(self, peer: str) -> str | None:
        with self._lock:
            in_all = sum(self._open.values())
            if in_all >= self.total:
                return f"too many open streams ({in_all}); poll instead, or retry later"
            if self._open[peer] >= self.per_peer:
                return f"too many open streams from one connection ({self.per_peer}); poll instead"
            self._open[peer] += 1
        return None

    def _leave(self, peer: str) -> None:
        with self._lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    @property
    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())


def bind(srv: grpc.Server, host: str, port: int) -> str:
    """Bind `srv` to host:port (0: any free port) and return the address actually bound."""
    try:
        bound = srv.add_insecure_port(f"{host}:{port}")
    except RuntimeError as err:  # grpc raises on a taken port
        raise OSError(f"cannot listen on {host}:{port}: {err}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return f"{host}:{bound}"


def add_health(srv: grpc.Server) -> health.HealthServicer:
    """Serve grpc.health.v1 on `srv`; NOT_SERVING until the owner says otherwise."""
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    return servicer


def set_serving(servicer: health.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    servicer.set("", status)


def check_health(ch: grpc.Channel, timeout: float = HEALTH_TIMEOUT_S) -> str | None:
    """None if the server at `ch` answers SERVING, else a one-line reason."""
    try:
        reply = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
    except grpc.RpcError as err:
        return describe(err)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"health status {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def describe(err: grpc.RpcError) -> str:
    """A one-line description of a failed call (a sync call's error, or grpc.aio's `AioRpcError`)."""
    known = isinstance(err, (grpc.Call, grpc.aio.AioRpcError))
    code = err.code() if known else None
    details = err.details() if known else str(err)
    name = code.name if code is not None else "ERROR"
    return f"{name}: {(details or '').splitlines()[0] if details else 'no details'}"


def setup_logging(name: str, level: str = "WARNING") -> logging.Logger:
    """One-line log records on stderr, prefixed by the process's role."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.WARNING),
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return logging.getLogger(name)


def exit_with_parent(on_orphan: Callable[[], None], interval: float = 0.5) -> threading.Thread:
    """Call `on_orphan` once if this process's parent dies (the launcher was killed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        on_orphan()

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def join_all(threads: Iterable[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
