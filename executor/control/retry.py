"""Delivering one control-plane call with retries: the scheduler's Enqueue and the workers' Report."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc


def deliver(
    call: Callable[[], object],
    *,
    attempts: int,
    backoff_s: float,
    stopping: threading.Event,
    permanent: Callable[[grpc.RpcError], bool] = lambda err: False,
) -> bool:
    """Make `call` until it succeeds, waiting `backoff_s`, then twice as long, ... between attempts.

    True once delivered; False if `stopping` is set when an attempt fails (the failure is expected then).
    The last attempt's error, or the first that `permanent` says no retry can cure, is raised.
    """
    for attempt in range(attempts):
        try:
            call()
            return True
        except grpc.RpcError as err:
            if stopping.is_set():
                return False
            if permanent(err) or attempt == attempts - 1:
                raise
        if stopping.wait(backoff_s * 2**attempt):
            return False
    raise ValueError(f"at least one attempt is needed, got {attempts}")
