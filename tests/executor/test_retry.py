"""`executor.control.retry.deliver`: how many attempts a call gets, and when it gives up quietly or loudly."""

from __future__ import annotations

import threading

import grpc
import pytest

from executor.control.retry import deliver


class Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class Flaky:
    """Fails `failures` times with `code`, then succeeds; counts its calls."""

    def __init__(self, failures: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.failures, self.code, self.calls = failures, code, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise Failure(self.code)


def test_a_call_is_repeated_until_it_succeeds_within_its_attempts() -> None:
    call = Flaky(2)
    assert deliver(call, attempts=3, backoff_s=0.0, stopping=threading.Event())
    assert call.calls == 3


def test_the_last_attempts_error_is_raised() -> None:
    call = Flaky(3)
    with pytest.raises(Failure):
        deliver(call, attempts=3, backoff_s=0.0, stopping=threading.Event())
    assert call.calls == 3


def test_a_permanent_error_is_raised_at_once() -> None:
    call = Flaky(1, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(Failure):
        deliver(
            call,
            attempts=3,
            backoff_s=0.0,
            stopping=threading.Event(),
            permanent=lambda err: err.code() is grpc.StatusCode.INVALID_ARGUMENT,
        )
    assert call.calls == 1


def test_a_failure_while_stopping_gives_up_quietly() -> None:
    stopping = threading.Event()
    stopping.set()
    call = Flaky(1)
    assert not deliver(call, attempts=1, backoff_s=0.0, stopping=stopping)  # even on its last attempt
    assert call.calls == 1
