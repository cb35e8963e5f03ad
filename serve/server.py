"""`sangam serve` in one process: uvicorn runs the HTTP app on the main thread while a thread starts the
cluster of `sangam live` (scheduler and worker processes, `executor.run.launcher`) and then watches it.

The HTTP port answers from the first moment: 503 until every worker has registered. A process that dies
turns every later request (and `/health`) into 503. SIGTERM or Ctrl-C drains: new requests get 503,
running ones may finish, then the results go to `--out` (if set), every process is stopped and the
command exits 0 (1 if the cluster had failed), all within `--drain-timeout` seconds (`DrainingServer`
cuts what still runs in time for the stop). A second signal stops at once.

No connection stays open on a client's whim: its headers must arrive within `--header-timeout`, its body
within `--body-timeout` after them (else 408 and the connection closes: `TimedHttp`), and it may idle
between requests for `--keep-alive-timeout`. Nor may one request's headers hold the event loop: past
`MAX_HEADER_BYTES` they get a 431 and the connection closes (httptools' parser takes time that grows with
the square of one header's length: an 80 MiB header stalled every other client for seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from executor.control.client import SangamError
from executor.control.messages import ClusterStatus
from executor.run.launcher import LiveError, LocalCluster
from executor.run.live import LivePlan, plural, ready_facts, write_served
from executor.run.live_collect import Collector
from executor.run.live_options import LiveOptions
from serve.app import AppConfig, create_app
from serve.backend import ClusterBackend, Limits, ServingState
from serve.errors import APIError
from serve.options import ServeOptions
from serve.tokenizer import eos_mismatch, load_tokenizer

WATCH_INTERVAL_S = 0.5
GRACEFUL_S = 1.0  # after the drain: how long uvicorn waits for connections before it closes them
STOP_RESERVE_S = 1.5  # of --drain-timeout (at most half), kept for stopping the processes
CUT_GRACE_S = 0.5  # after the drain's cut: how long the cut requests' answers may take to go out
STOP_S = 10.0  # how long stopping the processes may take after an end without a drain (a failure)
MIN_STOP_S = 0.5  # and after a drain, at least


class DrainingServer(uvicorn.Server):
    """uvicorn that drains on its first SIGTERM or SIGINT instead of closing the socket at once.

    The drain's time, `drain_timeout`, covers all of it: the requests still running when what is left of
    it is the time kept for stopping the processes (`STOP_RESERVE_S`, at most half) are cut (`on_cut`:
    each answers 503, or a stream its error event and `[DONE]`), so that uvicorn finds no request to
    wait for and the processes stop in the time kept."""

    def __init__(
        self,
        config: uvicorn.Config,
        state: ServingState,
        drain_timeout: float,
        on_started: Callable[[], None],
        on_cut: Callable[[str], None],
    ) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.drain_end: float | None = None  # when the drain must be over (the processes stopped)
        self.drain_deadline: float | None = None  # the requests' deadline (the cut), once draining
        self.cut_at: float | None = None  # when they were cut
        self.on_started = on_started
        self.on_cut = on_cut

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.on_started()  # signals are ours by now: a SIGTERM from here on drains

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is None:
            self.state.draining = True
            self.drain_end = time.monotonic() + self.drain_timeout
            self.drain_deadline = self.drain_end - min(STOP_RESERVE_S, self.drain_timeout / 2)
        else:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        deadline, now = self.drain_deadline, time.monotonic()
        if deadline is not None:
            if self.state.in_flight == 0:
                self.should_exit = True
            elif self.cut_at is None and now >= deadline:
                self.cut_at = now
                limit = f"--drain-timeout {self.drain_timeout:g}"
                self.on_cut(f"the server shut down before the request finished ({limit})")
            elif self.cut_at is not None and now >= self.cut_at + CUT_GRACE_S:
                self.should_exit = True
        return await super().on_tick(counter)

    def stop_timeout(self) -> float:
        """How long stopping the processes may take: what is left of the drain (`MIN_STOP_S` at least),
        or `STOP_S` when the server ended without one."""
        if self.drain_end is None:
            return STOP_S
        return max(MIN_STOP_S, self.drain_end - time.monotonic())


MAX_HEADER_BYTES = 256 * 1024  # a request's headers, at most (uvicorn's h11 parser allows 16 KiB)


class TimedHttp(HttpToolsProtocol):
    """uvicorn's httptools connection with deadlines (uvicorn has only the keep-alive one): a request's
    headers must all arrive within `header_timeout` of the connection's start or of the request's first
    byte, its body within `body_timeout` of its headers; a request pipelined behind a response not yet
    sent has neither deadline until that response's end (uvicorn may not read it before), then the one
    of the part it is in. A deadline missed before a response began is a 408; either way the connection
    closes, and an app still reading the body sees the client leave. A request whose bytes other than its
    body (headers; a chunked body's framing and trailers) pass `MAX_HEADER_BYTES` (not counting a chunk
    that also ended the request before) gets a 431 and the connection closes. An error is written only
    where it answers the request being read: where another request's response is pending or under way, or
    this one's has begun, the connection just closes. (`timed_protocol` sets the timeouts.)"""

    header_timeout = 10.0
    body_timeout = 30.0
    keep_alive_timeout = 5.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.keep_alive_timeout  # type: ignore[assignment]  # a float is fine
        self._deadline: asyncio.TimerHandle | None = None
        # the bytes of a request that are not its body (its headers, a chunked body's framing and trailers,
        # which httptools parses as it does headers); None between requests. A chunk that also ended the
        # request before is not counted (whose bytes were whose is not known).
        self._overhead: int | None = None
        self._body_bytes = 0
        self._ended_in_chunk = False
        self._own: Any = None  # the cycle of the request being read, once its headers are in
        self._ahead: Any = None  # the last cycle before it whose response was not sent when it was queued

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._overhead, self._own = 0, None
        if self.cycle is not None and not self.cycle.response_complete:
            self._ahead = self.cycle  # pipelined: its deadlines wait for the answer ahead
            self._disarm()
        elif self._deadline is None:  # after a response (the first request's runs from the connection's)
            self._arm(self.header_timeout, "headers")

    def data_received(self, data: bytes) -> None:
        self._ended_in_chunk, body_before = False, self._body_bytes
        super().data_received(data)
        if self._overhead is None or self._ended_in_chunk or self.transport.is_closing():
            return
        self._overhead += len(data) - (self._body_bytes - body_before)
        if self._overhead > MAX_HEADER_BYTES:
            self._disarm()
            self._refuse(431, "Request Header Fields Too Large", f"headers over {MAX_HEADER_BYTES} bytes")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse: OpenAI's error JSON, as every other error (uvicorn's is text)."""
        self._refuse(400, "Bad Request", f"{msg.rstrip('.')}: malformed HTTP")

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        self._own = self.cycle if self.cycle is not before else None
        if self._ahead is None:
            self._arm(self.body_timeout, "body")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._ahead is not None and self._ahead.response_complete:
            self._ahead = None
            if self._overhead is not None:  # the request behind it is still arriving: its part's deadline
                self._arm(*((self.body_timeout, "body") if self._own else (self.header_timeout, "headers")))

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._overhead, self._ended_in_chunk = None, True
        self._disarm()

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, seconds, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, seconds: float, what: str) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self._refuse(408, "Request Timeout", f"the request's {what} did not arrive within {seconds:g} s")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """Answer `status` with OpenAI's error JSON and close; only close where the answer would not be read
        as this request's (`_answers_now`)."""
        if not self._answers_now():
            self.transport.close()
            return
        body = bytes(APIError(status, message).response().body)
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n".encode()
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self.transport.close()

    def _answers_now(self) -> bool:
        """Whether a response written now answers the request being read: no other request's response is
        pending or under way (responses go out in order: the last one ahead is enough), nor this one's."""
        others = [c for c in (self._ahead, self.cycle) if c is not None and c is not self._own]
        return all(c.response_complete for c in others) and not (self._own and self._own.response_started)


def timed_protocol(header: float, body: float, keep_alive: float) -> type[TimedHttp]:
    """`TimedHttp` with these timeouts (seconds)."""
    timeouts = {"header_timeout": header, "body_timeout": body, "keep_alive_timeout": keep_alive}
    return type("TimedHttp", (TimedHttp,), timeouts)


def uvicorn_config(app: Any, options: ServeOptions, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's settings for the app: `options`' timeouts, no access log."""
    protocol = timed_protocol(options.header_timeout, options.body_timeout, options.keep_alive_timeout)
    return uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off", access_log=False, **kwargs)


def listen(host: str, port: int) -> socket.socket:
    """The HTTP socket, bound now so that a taken port is a one-line error before anything starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY on these
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_server(plan: LivePlan, live: LiveOptions, options: ServeOptions, out: Path | None) -> int:
    """Serve until drained; 0 after a clean drain, 1 if the cluster failed; ValueError/OSError for bad
    input (exit 2)."""
    tokenizer = load_tokenizer(options.tokenizer, live.weights, trust_remote_code=live.trust_remote_code)
    sock = listen(options.host, options.port)
    host, port = sock.getsockname()[:2]
    state = ServingState()
    backend = ClusterBackend(live.api_key)
    settings = AppConfig(plan.model, live.api_key, options.max_waiting, options.served_model_name)
    app = create_app(backend, tokenizer, state, settings)
    config = uvicorn_config(app, options, timeout_graceful_shutdown=int(GRACEFUL_S))
    cluster = LocalCluster(plan.cluster, live.log_dir)
    stopping = threading.Event()
    collected: Collector | None = None  # finished requests' records, fetched as the server runs (--out)

    def failed(status: ClusterStatus | None) -> None:
        """The scheduler's failure (its layout cannot serve and no worker comes back) is the server's:
        every request gets 503 with it, and the exit status is 1."""
        if status is not None and status.failure and not state.failure:
            state.failure = status.failure
            print(f"sangam serve: error: {status.failure}", file=sys.stderr, flush=True)

    def start_and_watch() -> None:
        nonlocal collected
        try:
            status = cluster.start(live.startup_timeout)
            facts = ready_facts(status)
            backend.address = cluster.address
            state.limits = Limits(
                plan.model, facts.vocab, facts.mask_id, facts.eos_ids, status.mask_len, facts.context_len,
                facts.pages,
            )  # fmt: skip
            warning = eos_mismatch(tokenizer, facts.eos_ids)
            if warning:
                print(f"sangam serve: warning: {warning}", file=sys.stderr, flush=True)
            devices = ", ".join(sorted(set(plan.devices)))
            print(
                f"sangam serve: {plan.model} on {plural(len(plan.devices), 'worker')} ({devices}, "
                f"{plan.config.layout.name}) at http://{host}:{port}/v1 (tokenizer: {tokenizer.name}; "
                f"logs in {cluster.log_dir}); SIGTERM or Ctrl-C drains and stops",
                flush=True,
            )
            assert cluster.client is not None
            collected = Collector(cluster.client)
            while not stopping.wait(WATCH_INTERVAL_S):
                cluster.check()
                if out is not None:
                    collected.poll()  # so that a lost scheduler loses no finished request's results
                with contextlib.suppress(SangamError):  # a slow answer is no failure; a dead scheduler is
                    failed(collected.status if out is not None else cluster.client.status())
        except (LiveError, ValueError, SangamError) as err:
            if not stopping.is_set():
                state.failure = str(err)
                print(f"sangam serve: error: {err}", file=sys.stderr, flush=True)
                server.should_exit = True

    watcher = threading.Thread(target=start_and_watch, name="cluster", daemon=True)
    server = DrainingServer(
        config, state, options.drain_timeout, on_started=watcher.start, on_cut=backend.cut
    )
    try:
        server.run(sockets=[sock])
    finally:
        stopping.set()
        if watcher.is_alive():
            watcher.join(timeout=WATCH_INTERVAL_S * 2)
        if cluster.client is not None and not state.failure:
            with contextlib.suppress(SangamError):  # the last word: a failure since the watch's last look
                failed(cluster.client.status())
        try:
            if out is not None and collected is not None:
                facts = {"server": "sangam serve", "served_model_name": list(settings.names)}
                write_results(plan, collected, out, state, {**facts, "tokenizer": tokenizer.name})
        finally:
            cluster.stop(server.stop_timeout())
            if not state.failure:
                cluster.remove_logs()
            sock.close()
    print("sangam serve: stopped", file=sys.stderr)
    return 1 if state.failure else 0


def write_results(
    plan: LivePlan, collected: Collector, out: Path, state: ServingState, server: dict[str, Any]
) -> None:
    """`--out`: every finished request, fetched last now if the scheduler still answers; marked partial
    when the cluster failed or the last fetch did. The summary's config is what served, with `server`'s
    facts."""
    cause = state.failure or None
    try:
        collected.fetch()
    except SangamError as err:
        cause = cause or f"the scheduler stopped answering: {err}"
    try:
        count = write_served(plan, collected, out, cause, server)
    except OSError as err:
        state.failure = f"cannot write the results to {out}: {err}"
        print(f"sangam serve: error: {state.failure}", file=sys.stderr)
        return
    what = " (partial: the server did not end normally)" if cause else ""
    print(f"sangam serve: {count} finished requests written to {out}{what}", file=sys.stderr)
