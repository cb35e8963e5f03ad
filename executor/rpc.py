"""gRPC plumbing shared by the scheduler, the workers, the client and the launcher.

Every RPC made here carries a deadline; servers bind fail-fast (no port reuse) and cap message sizes.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

MAX_MESSAGE_BYTES = 64 << 20
CALL_TIMEOUT_S = 10.0  # default deadline of a unary control-plane call
HEALTH_TIMEOUT_S = 2.0

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def channel(address: str) -> grpc.Channel:
    """An insecure channel to `address` (host:port) with Sangam's message limits."""
    return grpc.insecure_channel(address, options=_OPTIONS)


def server(threads: int, max_concurrent_rpcs: int | None = None) -> grpc.Server:
    """A thread-pool server; `so_reuseport` off so that binding a taken port fails at once."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        options=[*_OPTIONS, ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )


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
    """A one-line description of a failed call."""
    code = err.code() if isinstance(err, grpc.Call) else None
    details = err.details() if isinstance(err, grpc.Call) else str(err)
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
