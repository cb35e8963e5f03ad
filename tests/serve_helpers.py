"""Helpers for the HTTP server's tests: a fake scheduler behind the app, the app on a real socket in a
thread, and `sangam serve` as a subprocess."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn
from live_helpers import subprocess_env

from executor.control.messages import (
    ClusterStatus,
    Logprobs,
    RequestState,
    RequestStatus,
    Submission,
    WorkerState,
)
from serve.app import AppConfig, create_app
from serve.backend import Limits, ServingState
from serve.options import ServeOptions
from serve.server import listen, uvicorn_config
from serve.tokenizer import BuiltinTokenizer, TextTokenizer

EOS, MASK, VOCAB = 298, 299, 300  # the tiny models' and the built-in BPE's
LIMITS = Limits("fake-model", VOCAB, MASK, (EOS,), mask_len=128, context_len=512, pages=30)
TOKENIZER = BuiltinTokenizer()


def letter(index: int) -> int:
    """The id of the capital letter `index` (0: A) in the built-in BPE."""
    (token,) = TOKENIZER.encode(chr(65 + index))
    return token


@dataclass
class FakeBackend:
    """A scheduler that runs each request's blocks at once: block b's tokens come from `tokens(sub, b)`;
    `hold` makes every request stay QUEUED until released."""

    tokens: Callable[[Submission, int], list[int]] = lambda sub, b: [letter(b)] * 32
    hold: asyncio.Event | None = None
    submitted: list[Submission] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    _subs: dict[int, Submission] = field(default_factory=dict)

    async def submit(self, submission: Submission) -> RequestState:
        rid = len(self.submitted)
        self.submitted.append(submission)
        self._subs[rid] = submission
        return result(rid, "QUEUED", [], 0, submission.gen_len // 32)

    async def stream(self, request_id: int) -> AsyncIterator[RequestState]:
        sub = self._subs[request_id]
        n_blocks = sub.gen_len // 32
        yield result(request_id, "QUEUED", [], 0, n_blocks)
        if self.hold is not None:
            await self.hold.wait()
        ids: list[int] = []
        for b in range(n_blocks):
            await asyncio.sleep(0)
            block = self.tokens(sub, b)
            ids += block
            eos = EOS in block
            done = b + 1 == n_blocks or eos
            top = sub.sampling.logprobs
            logprobs = None if top is None else fake_logprobs(ids, top)
            yield result(
                request_id, "DONE" if done else "RUNNING", ids, b + 1, n_blocks, eos=eos, logprobs=logprobs
            )
            if done:
                return

    async def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)

    async def status(self) -> ClusterStatus:
        worker = WorkerState(0, "colocated", LIMITS.pages, LIMITS.pages, forwards_at_risk=7)
        return ClusterStatus(
            True, 1, 1, len(self.submitted), 0, 0, 0, "", LIMITS.mask_len, "1C", 0, 0, 0, 0, 0.0, (worker,),
            None,
        )  # fmt: skip


def result(
    rid: int, status: str, ids: Sequence[int], blocks: int, n_blocks: int, *, eos: bool = False,
    logprobs: Logprobs | None = None,
) -> RequestState:  # fmt: skip
    return RequestState(
        rid, RequestStatus(status), "", tuple(ids), blocks, n_blocks, eos, 0.0, 0.0, (3,) * blocks,
        logprobs=logprobs,
    )  # fmt: skip


def fake_logprobs(ids: Sequence[int], top: int) -> Logprobs:
    """The fake scheduler's log-probs: token i's is -i / 100, and its alternatives are the `top` ids
    after it, each one less likely by 1."""
    token = tuple(-i / 100 for i in range(len(ids)))
    alternatives = [
        ((t + j + 1) % VOCAB, lp - j - 1) for t, lp in zip(ids, token, strict=True) for j in range(top)
    ]
    return Logprobs(token, top, tuple(a for a, _ in alternatives), tuple(lp for _, lp in alternatives))


@contextmanager
def app_server(
    backend: FakeBackend,
    *,
    api_key: str | None = None,
    max_waiting: int = 256,
    state: ServingState | None = None,
    served_names: tuple[str, ...] = (),
    options: ServeOptions | None = None,
    tokenizer: TextTokenizer = TOKENIZER,
    servers: list[uvicorn.Server] | None = None,
) -> Iterator[tuple[str, ServingState]]:
    """The app over `backend` on a real loopback socket, uvicorn in a thread (with `options`' timeouts, as
    `sangam serve` runs it); yields its base URL. `servers` gets the uvicorn server (its connections and
    request tasks)."""
    state = state if state is not None else ServingState(limits=LIMITS)
    config = AppConfig("fake-model", api_key, max_waiting, served_names)
    app = create_app(backend, tokenizer, state, config)  # type: ignore[arg-type]
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(app, options or ServeOptions()))
    if servers is not None:
        servers.append(server)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", state
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def wait_http(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Until GET url answers 200 (the server is up and ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sangam serve exited with status {process.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout:g} s")


def start_serve(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """`sangam serve ARGS` as a subprocess of this test (its output to `log`)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", *args], stdout=out, stderr=subprocess.STDOUT,
            env=subprocess_env(),
        )  # fmt: skip
