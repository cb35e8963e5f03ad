"""KV transfer between live workers over torch.distributed, and the measurement of that path.

Rendezvous. Every worker of a disaggregated or hybrid layout opens one `TCPStore` client; worker 0 hosts
the store on the port the launcher chose (`--dist-port`). Each (prefill worker, decode-role worker) pair
gets its own two-rank process group built on that store under `sangam/kv/<src>-<dst>/<generation>`:
rank 0 is the source, rank 1 the destination. A failed attempt leaves a pair's group unusable (a gloo
timeout closes the pair's connection, an NCCL timeout leaves the communicator hung), so the scheduler
raises the pair's *generation* after every failed attempt and both ends build a fresh group for it
before their next transfer. Every group build, and the warm-up message that checks it, has the setup
timeout; every wire operation of a transfer has the transfer deadline (both well under NCCL's 600 s).

Transports. `gloo` moves host memory: CPU workers send their cache pages directly, GPU workers stage
them through pinned host memory (the path for two workers sharing one GPU, where NCCL refuses two ranks
on one device). `nccl` moves device memory between distinct GPUs.

What moves. All layers' pages of one request are packed into one contiguous buffer
`(layers, pages, 2, PAGE, kv_heads, head_dim)` (the paged cache's own page layout) and sent as a few
messages of whole layers, at most `CHUNK_BYTES` each; the receiver scatters the buffer into the pages
it allocated. Each end runs its transfers on one thread per peer, in the order the scheduler issued
them (the same order at both ends), so the worker's iteration loop never waits on the network.

    python -m executor.kv_transfer measure --name cpu-gloo --device cpu

measures this path (pack, send, receive, unpack: from the sender's start to the receiver's end) for
several sizes between two processes, fits seconds = latency + bytes / bandwidth, and writes the link
profile `profiles/data/links/<name>.json` that `sim.links.load_link` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import platform
import queue
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from executor.ports import free_port

log = logging.getLogger("sangam.kv_transfer")

TRANSPORTS = ("gloo", "nccl")
CHUNK_BYTES = 256 << 20  # one message carries whole layers, at most this many bytes (or one layer)
WARMUP_TAG = 0  # the scheduler's tags start at 1
STORE_PREFIX = "sangam/kv"
REPO_ROOT = Path(__file__).resolve().parent.parent
LINKS_DIR = REPO_ROOT / "profiles" / "data" / "links"


class TransferError(RuntimeError):
    """One end of a transfer attempt failed; the message is one line."""


def one_line(err: BaseException) -> str:
    """The first line of an error, without gloo's `[file:line]` prefix."""
    text = str(err).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", line)


def _delta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def open_store(host: str, port: int, *, is_master: bool, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store: worker 0 hosts it, the others connect (retrying up to `timeout_s`)."""
    return dist.TCPStore(host, port, is_master=is_master, timeout=_delta(timeout_s), wait_for_workers=False)


@dataclass(frozen=True, slots=True)
class LinkConfig:
    transport: str  # gloo or nccl
    timeout_s: float  # deadline of the wire operations of one transfer attempt
    setup_timeout_s: float  # building a pair's group and its warm-up message
    host: str = "127.0.0.1"  # the address gloo binds on this worker

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"unknown KV transport {self.transport!r} (known: {', '.join(TRANSPORTS)})")
        if not (self.timeout_s > 0 and self.setup_timeout_s > 0):
            raise ValueError("KV transfer timeouts must be positive")


# ---- packing ------------------------------------------------------------------------------------------


class KVPacker:
    """A request's pages of every layer, gathered into (or scattered from) one contiguous staging buffer.

    The buffer is `(layers, pages, *page_shape)`; it lives with the cache, or in pinned host memory when a
    GPU cache moves over gloo. One packer belongs to one thread: it reuses its host buffer and its CUDA
    stream; a buffer on the GPU is let go after every transfer (`done`), since it is memory the KV pool
    does not count.
    """

    def __init__(self, layers: Sequence[Tensor], *, host_staging: bool) -> None:
        if not layers:
            raise ValueError("a KV cache without layers has nothing to move")
        first = layers[0]
        self.layers = list(layers)
        self.page_shape = tuple(first.shape[1:])
        self.dtype = first.dtype
        self.device = first.device
        on_gpu = first.device.type == "cuda"
        self.staging = torch.device("cpu") if host_staging else first.device
        self.pinned = on_gpu and host_staging
        self.page_elems = math.prod(self.page_shape)
        self._flat: Tensor | None = None
        self._stream = torch.cuda.Stream(first.device) if on_gpu else None

    @property
    def bytes_per_page(self) -> int:
        """Bytes of one page over every layer: what a request moves per page."""
        return len(self.layers) * self.page_elems * self.layers[0].element_size()

    def buffer(self, n_pages: int) -> Tensor:
        """The staging buffer for `n_pages` pages (reused; grown at least twofold, since pinning is slow)."""
        need = len(self.layers) * n_pages * self.page_elems
        if self._flat is None or self._flat.numel() < need:
            have = 0 if self._flat is None else self._flat.numel() // (len(self.layers) * self.page_elems)
            pages = -(-max(n_pages, 2 * have) // 32) * 32
            self._flat = None  # free the old one first
            size = len(self.layers) * pages * self.page_elems
            self._flat = torch.empty(size, dtype=self.dtype, device=self.staging, pin_memory=self.pinned)
        return self._flat[:need].view(len(self.layers), n_pages, *self.page_shape)

    def done(self) -> None:
        """A transfer is over: let a GPU staging buffer go (host ones are kept)."""
        if self.staging.type == "cuda":
            self._flat = None

    def pack(self, pages: Sequence[int]) -> Tensor:
        """Gather `pages` of every layer into the staging buffer (complete when this returns)."""
        buf = self.buffer(len(pages))
        index = torch.tensor(list(pages), dtype=torch.long, device=self.device)
        with self._on_stream(), torch.no_grad():
            for i, layer in enumerate(self.layers):
                if buf.device == layer.device:
                    torch.index_select(layer, 0, index, out=buf[i])
                else:
                    buf[i].copy_(layer.index_select(0, index), non_blocking=True)
        self._sync()
        return buf

    def unpack(self, pages: Sequence[int], buf: Tensor) -> None:
        """Scatter the staging buffer into `pages` of every layer (complete when this returns)."""
        index = torch.tensor(list(pages), dtype=torch.long, device=self.device)
        with self._on_stream(), torch.no_grad():
            for i, layer in enumerate(self.layers):
                rows = buf[i] if buf.device == layer.device else buf[i].to(layer.device, non_blocking=True)
                layer.index_copy_(0, index, rows)
        self._sync()

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            yield

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()


def chunks(buf: Tensor, limit: int = CHUNK_BYTES) -> list[Tensor]:
    """Contiguous slices of whole layers (the buffer's first dimension), each at most `limit` bytes."""
    layer_bytes = buf[0].numel() * buf.element_size() if len(buf) else 0
    per = max(1, limit // layer_bytes) if layer_bytes else len(buf) or 1
    return [buf[i : i + per] for i in range(0, len(buf), per)]


# ---- one pair's process group ------------------------------------------------------------------------


class PairLink:
    """This worker's end of one (source, destination) pair's two-rank process group."""

    def __init__(self, store: dist.Store, src: int, dst: int, me: int, config: LinkConfig) -> None:
        if me not in (src, dst):
            raise ValueError(f"worker {me} is no end of the pair {src}->{dst}")
        self.store = store
        self.src, self.dst = src, dst
        self.config = config
        self.rank = 0 if me == src else 1
        self.peer = dst if me == src else src
        self.generation = -1
        self.group: Any = None
        self.broken = ""  # why the current group cannot be used any more

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    def ensure(self, generation: int) -> None:
        """Use the group of `generation` or a later one, building generation `generation` (together with
        the peer) if the current one is older. Both ends see the same orders in the same sequence, so they
        build at the same one."""
        if generation <= self.generation and self.group is not None:
            if self.broken:
                raise TransferError(f"the link {self.name} is broken: {self.broken}")
            return
        self.close()
        prefix = dist.PrefixStore(f"{STORE_PREFIX}/{self.src}-{self.dst}/{generation}", self.store)
        try:
            self.group = self._build(prefix)
            self.generation, self.broken = generation, ""
            probe = torch.ones(1, device=self._device())
            deadline = time.monotonic() + self.config.setup_timeout_s
            if self.rank == 0:
                self._wait(self.group.send([probe], 1, WARMUP_TAG), deadline, "warm-up send")
            else:
                self._wait(self.group.recv([probe], 0, WARMUP_TAG), deadline, "warm-up receive")
        except TransferError:
            raise
        except Exception as err:
            self.broken = one_line(err)
            raise TransferError(
                f"cannot build the link {self.name} (generation {generation}): {self.broken}"
            ) from None

    def _device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if self.config.transport == "nccl"
            else torch.device("cpu")
        )

    def _build(self, prefix: dist.Store) -> Any:
        timeout = _delta(self.config.setup_timeout_s)
        if self.config.transport == "gloo":
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.config.host)]
            return dist.ProcessGroupGloo(prefix, self.rank, 2, options)
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise TransferError("this torch build has no NCCL")
        options = nccl.Options()
        options._timeout = timeout
        return nccl(prefix, self.rank, 2, options)

    def handshake(self, tag: int, deadline: float) -> None:
        """Agree with the peer, through the store, that both ends post transfer `tag` now.

        Each end marks itself ready and polls for the peer until `deadline`; then it proposes "go" (the
        peer is there) or "abort" (it is not) with one atomic compare-and-set, and both ends follow the
        value that won. So an end that comes too late finds "abort" and neither end posts an operation that
        could never complete: a late peer costs one transfer, not the link (a gloo timeout closes the
        pair's connection; an unmatched NCCL send never finishes).
        """
        key = f"{STORE_PREFIX}/{self.src}-{self.dst}/{self.generation}/t{tag}"
        self.store.set(f"{key}/r{self.rank}", "1")
        peer_key = f"{key}/r{1 - self.rank}"
        pause, started = 0.0001, time.monotonic()
        while not (present := self.store.check([peer_key])) and (now := time.monotonic()) < deadline:
            time.sleep(pause)  # polls (not the store's wait, whose timeout would leave a reply in flight)
            pause = min(2 * pause, 0.001 if now - started < 0.1 else 0.01)
        decided = self.store.compare_set(f"{key}/go", "", "go" if present else "abort")
        if present or decided == b"go":  # the second end to decide removes the attempt's keys
            with contextlib.suppress(Exception):
                self.store.delete_key(peer_key)
                if self.store.add(f"{key}/n", 1) == 2:
                    self.store.delete_key(f"{key}/go")
                    self.store.delete_key(f"{key}/n")
        if decided != b"go":
            me, wait = self.src if self.rank == 0 else self.dst, f"{self.config.timeout_s:g} s"
            if present:
                raise TransferError(
                    f"worker {me} reached the transfer after worker {self.peer} gave up ({wait})"
                )
            raise TransferError(f"worker {self.peer} was not ready for the transfer within {wait}")

    def send(self, buf: Tensor, tag: int, deadline: float) -> None:
        self._exchange(buf, tag, deadline, "send")

    def recv(self, buf: Tensor, tag: int, deadline: float) -> None:
        self._exchange(buf, tag, deadline, "receive")

    def _exchange(self, buf: Tensor, tag: int, deadline: float, what: str) -> None:
        if self.group is None or self.broken:
            raise TransferError(f"the link {self.name} is broken: {self.broken or 'not built'}")
        other = 1 - self.rank
        try:
            if what == "send":
                works = [self.group.send([part], other, tag) for part in chunks(buf)]
            else:
                works = [self.group.recv([part], other, tag) for part in chunks(buf)]
        except Exception as err:
            self.broken = one_line(err)
            raise TransferError(f"{what} on the link {self.name} failed: {self.broken}") from None
        for work in works:
            self._wait(work, deadline, what)

    def _wait(self, work: Any, deadline: float, what: str) -> None:
        left = deadline - time.monotonic()
        try:
            if self.config.transport == "nccl":  # NCCL's wait() only orders streams: poll the host side
                while not work.is_completed():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"timed out after {self.config.timeout_s:g} s")
                    time.sleep(0.0005)
                work.wait()
            else:
                if left <= 0:
                    raise TimeoutError(f"timed out after {self.config.timeout_s:g} s")
                work.wait(_delta(left))
        except Exception as err:
            self.broken = one_line(err)
            self._abort()
            raise TransferError(f"{what} on the link {self.name} failed: {self.broken}") from None

    def _abort(self) -> None:
        with contextlib.suppress(Exception):
            if self.config.transport == "nccl" and self.group is not None:
                self.group.abort()

    def close(self) -> None:
        """Drop the current group (aborting an NCCL one that failed)."""
        if self.group is not None:
            if self.broken:
                self._abort()
            with contextlib.suppress(Exception):
                self.group.shutdown()
        self.group = None


# ---- the worker's transfer threads -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransferJob:
    """One end of one transfer attempt, as the worker's loop hands it to a link thread."""

    transfer_id: int
    attempt: int
    request_id: int
    tag: int
    generation: int
    pages: tuple[int, ...]  # this worker's page ids holding (or receiving) the request's KV


@dataclass(frozen=True, slots=True)
class TransferResult:
    send: bool  # the sending end (else the receiving end)
    job: TransferJob
    peer: int
    ok: bool
    error: str
    start: float  # time.monotonic()
    end: float
    nbytes: int


class LinkThread:
    """Runs one pair's transfers at this end, one at a time, in the order they were submitted."""

    def __init__(
        self,
        link: PairLink,
        on_result: Callable[[TransferResult], None],
        stall_s: Callable[[TransferJob], float] = lambda job: 0.0,
        device: torch.device | None = None,
    ) -> None:
        self.link = link
        self.sending = link.rank == 0
        self.on_result = on_result
        self.stall_s = stall_s
        self.device = device
        self.packer: KVPacker | None = None
        self.ready = threading.Event()
        self.failure = ""
        self._jobs: queue.SimpleQueue[TransferJob | None] = queue.SimpleQueue()
        kind = "send" if self.sending else "recv"
        self.thread = threading.Thread(target=self._run, name=f"kv-{kind}-{link.peer}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: TransferJob) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            self.link.ensure(0)
        except TransferError as err:
            self.failure = str(err)
        finally:
            self.ready.set()
        while True:
            job = self._jobs.get()
            if job is None:
                self.link.close()
                return
            try:
                result = self._transfer(job)
            except Exception as err:  # never lose a result: the scheduler waits for both ends
                log.exception("transfer %d failed unexpectedly", job.transfer_id)
                now = time.monotonic()
                result = TransferResult(self.sending, job, self.link.peer, False, one_line(err), now, now, 0)
            self.on_result(result)

    def _transfer(self, job: TransferJob) -> TransferResult:
        start = time.monotonic()
        nbytes = 0
        try:
            assert self.packer is not None, "the KV cache was never attached"
            nbytes = len(job.pages) * self.packer.bytes_per_page
            self.link.ensure(job.generation)
            if self.sending:
                buf = self.packer.pack(job.pages)
                deadline = time.monotonic() + self.link.config.timeout_s
                self.link.handshake(job.tag, deadline)
                self.link.send(buf, job.tag, deadline)
            else:
                stall = self.stall_s(job)
                if stall > 0:  # fault injection (tests): this end comes late
                    log.warning("stalling the receive of transfer %d for %.1f s", job.transfer_id, stall)
                    time.sleep(stall)
                buf = self.packer.buffer(len(job.pages))
                deadline = time.monotonic() + self.link.config.timeout_s
                self.link.handshake(job.tag, deadline)
                self.link.recv(buf, job.tag, deadline)
                self.packer.unpack(job.pages, buf)
        except TransferError as err:
            return TransferResult(
                self.sending, job, self.link.peer, False, str(err), start, time.monotonic(), nbytes
            )
        finally:
            if self.packer is not None:
                self.packer.done()
        return TransferResult(self.sending, job, self.link.peer, True, "", start, time.monotonic(), nbytes)


class KVTransfers:
    """A worker's links: one thread per peer it sends to (prefill role) or receives from (decode role)."""

    def __init__(
        self,
        worker_id: int,
        *,
        sends_to: Sequence[int],
        receives_from: Sequence[int],
        store: dist.Store,
        config: LinkConfig,
        on_result: Callable[[TransferResult], None],
        device: torch.device,
        stall_request: int | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.config = config
        self.device = device
        self._on_result = on_result
        self._stall_request = stall_request
        self.links: dict[tuple[bool, int], LinkThread] = {}
        for peer in sends_to:
            self.links[True, peer] = self._thread(PairLink(store, worker_id, peer, worker_id, config))
        for peer in receives_from:
            self.links[False, peer] = self._thread(PairLink(store, peer, worker_id, worker_id, config))

    def _thread(self, link: PairLink) -> LinkThread:
        return LinkThread(link, self._result, self._stall, self.device)

    def _result(self, result: TransferResult) -> None:
        self._on_result(result)

    def set_on_result(self, on_result: Callable[[TransferResult], None]) -> None:
        self._on_result = on_result

    def _stall(self, job: TransferJob) -> float:
        if self._stall_request is not None and job.request_id == self._stall_request:
            return self.config.timeout_s + 0.5
        return 0.0

    def connect(self) -> None:
        """Build every link's first group (all in parallel); RuntimeError naming the first that failed."""
        for thread in self.links.values():
            thread.start()
        deadline = time.monotonic() + self.config.setup_timeout_s + 5.0
        for (_, peer), thread in sorted(self.links.items()):
            if not thread.ready.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"the KV link with worker {peer} was not ready within the setup timeout")
            if thread.failure:
                raise RuntimeError(thread.failure)

    def attach(self, layers: Sequence[Tensor], reserve_pages: int = 0) -> None:
        """Give every link thread its packer over the worker's KV cache layers, each with a staging
        buffer for `reserve_pages` pages allocated now (pinning host memory mid-run stalls a transfer)."""
        host = self.config.transport == "gloo"
        for thread in self.links.values():
            thread.packer = KVPacker(layers, host_staging=host)
            if reserve_pages and host:
                thread.packer.buffer(reserve_pages)

    def send(self, peer: int, job: TransferJob) -> None:
        self._link(True, peer).submit(job)

    def receive(self, peer: int, job: TransferJob) -> None:
        self._link(False, peer).submit(job)

    def _link(self, sending: bool, peer: int) -> LinkThread:
        try:
            return self.links[sending, peer]
        except KeyError:
            way = "to" if sending else "from"
            raise TransferError(f"worker {self.worker_id} has no KV link {way} worker {peer}") from None

    def close(self) -> None:
        for thread in self.links.values():
            thread.stop()


# ---- measuring the path ------------------------------------------------------------------------------

DEFAULT_PAGES = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True, slots=True)
class Fit:
    latency_s: float
    gb_per_s: float
    r2: float
    max_rel_error: float


def fit_link(points: Sequence[tuple[int, float]]) -> Fit:
    """seconds = latency + bytes / bandwidth by least squares weighted by 1/seconds^2 (relative error)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fitting a link needs at least two sizes")
    w = [1.0 / max(s, 1e-9) ** 2 for _, s in points]
    sw = sum(w)
    mx = sum(wi * b for wi, (b, _) in zip(w, points, strict=True)) / sw
    my = sum(wi * s for wi, (_, s) in zip(w, points, strict=True)) / sw
    sxx = sum(wi * (b - mx) ** 2 for wi, (b, _) in zip(w, points, strict=True))
    sxy = sum(wi * (b - mx) * (s - my) for wi, (b, s) in zip(w, points, strict=True))
    slope = sxy / sxx
    latency = my - slope * mx
    if slope <= 0:
        raise ValueError("the measured times do not grow with the size: cannot fit a bandwidth")
    if latency < 0:  # refit through the origin: no negative latency
        latency = 0.0
        slope = sum(wi * b * s for wi, (b, s) in zip(w, points, strict=True)) / sum(
            wi * b * b for wi, (b, _) in zip(w, points, strict=True)
        )
    predicted = [latency + slope * b for b, _ in points]
    mean = statistics.fmean(s for _, s in points)
    ss_res = sum((s - p) ** 2 for (_, s), p in zip(points, predicted, strict=True))
    ss_tot = sum((s - mean) ** 2 for _, s in points) or 1e-30
    worst = max(abs(p - s) / s for (_, s), p in zip(points, predicted, strict=True))
    return Fit(latency, 1.0 / (slope * 1e9), 1.0 - ss_res / ss_tot, worst)


def recorded_command(argv: Sequence[str]) -> str:
    """The command line that made a profile, without `--out DIR` (a path of the measuring machine)."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg == "--out":
            skip = not skip
            continue
        if arg.startswith("--out="):
            continue
        kept.append(arg if arg.startswith("-") or " " not in arg else repr(arg))
    return " ".join(["python -m executor.kv_transfer", *kept])


def _bench(args: argparse.Namespace) -> int:
    """One end of the measurement (a child process of `measure`); rank 0 prints the points as JSON."""
    from sangam.hardware import PAGE, lookup_model

    spec = lookup_model(args.model)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = open_store("127.0.0.1", args.port, is_master=args.rank == 0, timeout_s=args.setup_timeout)
    config = LinkConfig(args.transport, args.timeout, args.setup_timeout)
    link = PairLink(store, 0, 1, args.rank, config)
    link.ensure(0)
    sizes = [int(p) for p in args.pages.split(",")]
    pool = max(sizes) + 8
    shape = (pool, 2, PAGE, spec.kv_heads, spec.head_dim)
    layers = [
        torch.empty(shape, dtype=torch.bfloat16, device=device).uniform_(-1, 1) for _ in range(spec.layers)
    ]
    packer = KVPacker(layers, host_staging=args.transport == "gloo")
    rng = random.Random(1)
    points: list[dict[str, Any]] = []
    tag = 1
    for n in sizes:
        seconds = []
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            pages = rng.sample(range(pool), n)
            key = f"bench/{tag}"
            store.set(f"{key}/ready{args.rank}", "1")
            store.wait([f"{key}/ready{1 - args.rank}"], _delta(args.setup_timeout))
            start = time.monotonic()
            deadline = start + args.timeout
            if args.rank == 0:
                link.send(packer.pack(pages), tag, deadline)
                end = float(store.get(f"{key}/end").decode())
                if repeat:
                    seconds.append(end - start)
            else:
                buf = packer.buffer(n)
                link.recv(buf, tag, deadline)
                packer.unpack(pages, buf)
                store.set(f"{key}/end", repr(time.monotonic()))
            tag += 1
        if args.rank == 0:
            nbytes = n * packer.bytes_per_page
            points.append(
                {
                    "pages": n,
                    "bytes": nbytes,
                    "seconds_median": statistics.median(seconds),
                    "seconds_min": min(seconds),
                    "seconds_max": max(seconds),
                    "repeats": len(seconds),
                }
            )
    if args.rank == 0:
        meta = {"bytes_per_page": packer.bytes_per_page, "geometry": args.model, "dtype": "bfloat16"}
        print(json.dumps({"points": points, **meta}), flush=True)
    link.close()
    return 0


def measure(args: argparse.Namespace) -> Path:
    """Run both ends as child processes, fit the points, write the link profile; its path."""
    port = free_port()
    common = [
        "--port", str(port), "--transport", args.transport, "--device", args.device, "--model", args.model,
        "--pages", args.pages, "--repeats", str(args.repeats), "--timeout", str(args.timeout),
        "--setup-timeout", str(args.setup_timeout),
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "executor.kv_transfer", "_bench", "--rank", str(rank), *common],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        out, _ = procs[0].communicate(timeout=args.limit)
        procs[1].wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    if procs[0].returncode or procs[1].returncode:
        raise RuntimeError(f"the measurement failed (exit {procs[0].returncode}, {procs[1].returncode})")
    raw = json.loads(out.strip().splitlines()[-1])
    points = raw.pop("points")
    fit = fit_link([(p["bytes"], p["seconds_median"]) for p in points])
    profile = {
        "name": args.name,
        "description": args.note,
        "transport": args.transport,
        "device": args.device,
        "staging": "pinned host memory" if args.transport == "gloo" and args.device != "cpu" else "none",
        "path": "pack the pages of every layer -> send -> receive -> scatter into pages; seconds from the "
        "sender's start to the receiver's end, median of the repeats",
        **fit_fields(fit),
        **raw,
        "points": points,
        "host": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        },
        "measured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": recorded_command(sys.argv[1:]),
    }
    return write_profile(profile, fit, Path(args.out), "")


def fit_fields(fit: Fit) -> dict[str, Any]:
    """A link profile's fitted figures, as `sim.links.load_link` reads them."""
    return {
        "gb_per_s": round(fit.gb_per_s, 4),
        "latency_s": round(fit.latency_s, 6),
        "fit": {
            "model": "seconds = latency_s + bytes / (gb_per_s * 1e9)",
            "method": "least squares weighted by 1/seconds^2",
            "r2": round(fit.r2, 5),
            "max_rel_error": round(fit.max_rel_error, 4),
        },
    }


def write_profile(profile: dict[str, Any], fit: Fit, out_dir: Path, source: str) -> Path:
    """Write `out_dir/<name>.json` and say what was fitted; the file's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{profile['name']}.json"
    path.write_text(json.dumps(profile, indent=2) + "\n")
    print(
        f"{profile['name']}: {fit.gb_per_s:.3f} GB/s, latency {1000 * fit.latency_s:.3f} ms{source} "
        f"(R^2 {fit.r2:.4f}, worst point off by {100 * fit.max_rel_error:.1f}%); wrote {path}"
    )
    return path


def live_points(results: Path, bytes_per_token: int | None = None) -> tuple[list[tuple[int, float]], str]:
    """(bytes, seconds) of every KV transfer of a `sangam live` run's results directory, and the model."""
    import csv

    from sangam.hardware import lookup_model

    summary = json.loads((results / "summary.json").read_text())
    model = summary.get("config", {}).get("model", "llada-8b")
    per_token = bytes_per_token or lookup_model(model).kv_bytes_per_token
    with (results / "requests.csv").open() as f:
        seq_len = {row["request_id"]: int(row["seq_len"]) for row in csv.DictReader(f)}
    points = []
    with (results / "blocks.csv").open() as f:
        for row in csv.DictReader(f):
            if row["transfer_start"] and row["transfer_end"]:
                seconds = float(row["transfer_end"]) - float(row["transfer_start"])
                points.append((seq_len[row["request_id"]] * per_token, seconds))
    return points, model


def fit_results(args: argparse.Namespace) -> Path:
    """Fit a link profile to the transfers a live run recorded (transfer_start to transfer_end)."""
    results = Path(args.results)
    points, model = live_points(results, args.bytes_per_token)
    if not points:
        raise ValueError(f"{results}: the run recorded no KV transfer")
    fit = fit_link(points)
    summary = json.loads((results / "summary.json").read_text())
    profile = {
        "name": args.name,
        "description": args.note,
        "source": f"the KV transfers of a sangam live run ({summary.get('config', {}).get('layout', '?')}, "
        f"{model}): seconds from the destination's link thread taking a transfer to the KV in its pages",
        **fit_fields(fit),
        "transfers": len(points),
        "points": [{"bytes": b, "seconds": round(t, 6)} for b, t in sorted(points)],
        "live_config": summary.get("config", {}),
        "command": recorded_command(sys.argv[1:]),
    }
    return write_profile(profile, fit, Path(args.out), f" from {len(points)} live transfers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m executor.kv_transfer", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("measure", "_bench"):
        sub = commands.add_parser(
            name,
            help="measure the KV transfer path, write a link profile"
            if name == "measure"
            else argparse.SUPPRESS,
        )
        sub.add_argument("--transport", choices=TRANSPORTS, default="gloo")
        sub.add_argument("--device", default="cpu", help="cpu, or cuda:N (both ends on it with gloo)")
        sub.add_argument(
            "--model", default="llada-8b", help="page geometry (layers, KV heads, head dim; bf16)"
        )
        sub.add_argument("--pages", default=",".join(map(str, DEFAULT_PAGES)), help="request sizes, in pages")
        sub.add_argument("--repeats", type=int, default=5)
        sub.add_argument("--timeout", type=float, default=60.0, help="seconds per transfer")
        sub.add_argument("--setup-timeout", type=float, default=60.0)
        if name == "measure":
            sub.add_argument(
                "--name", required=True, help="profile name (the file profiles/data/links/NAME.json)"
            )
            sub.add_argument("--note", default="", help="what was measured, where (goes into the file)")
            sub.add_argument("--out", default=str(LINKS_DIR))
            sub.add_argument("--limit", type=float, default=540.0, help="seconds for the whole measurement")
        else:
            sub.add_argument("--rank", type=int, required=True)
            sub.add_argument("--port", type=int, required=True)
    fit = commands.add_parser("fit-results", help="fit a link profile to the transfers of a live run")
    fit.add_argument("--results", required=True, help="a sangam live --out directory")
    fit.add_argument("--name", required=True, help="writes profiles/data/links/NAME.json")
    fit.add_argument("--bytes-per-token", type=int, help="KV bytes per token (default: the run's model)")
    fit.add_argument("--note", default="")
    fit.add_argument("--out", default=str(LINKS_DIR))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "_bench":
        return _bench(args)
    try:
        if args.command == "fit-results":
            fit_results(args)
        else:
            measure(args)
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        print(f"kv_transfer: error: {one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
