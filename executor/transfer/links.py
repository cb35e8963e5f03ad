"""KV transfer between live workers over torch.distributed.

Rendezvous. Every worker of a disaggregated or hybrid layout opens one `TCPStore` client to the store the
launcher hosts (`executor.run.launcher.host_rendezvous`), which outlives every worker. Each (prefill
worker, decode-role worker) pair gets its own two-rank process group built on that store under
`sangam/kv/<src>-<dst>/<generation>`: rank 0 is the source, rank 1 the destination. A failed attempt
leaves a pair's group unusable (a gloo timeout closes the pair's connection, an NCCL timeout leaves the
communicator hung), so the scheduler raises the pair's *generation* after every failed attempt and both
ends build a fresh group for it before their next transfer. Every group build, and the warm-up message
that checks it, has the setup timeout; every wire operation of a transfer has the transfer deadline (both
well under NCCL's 600 s).

Transports. `gloo` moves host memory: CPU workers send their cache pages directly, GPU workers stage
them through pinned host memory (the path for two workers sharing one GPU, where NCCL refuses two ranks
on one device). `nccl` moves device memory between distinct GPUs.

What moves. All layers' pages of one request are packed into one contiguous buffer
`(layers, pages, 2, PAGE, kv_heads, head_dim)` (the paged cache's own page layout) and sent as a few
messages of whole layers, at most `CHUNK_BYTES` each; the receiver scatters the buffer into the pages
it allocated. Each end runs its transfers on one thread per peer, in the order the scheduler issued
them (the same order at both ends), so the worker's iteration loop never waits on the network.
`calib.link_fit` measures this path and fits the simulator's link model to it.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from executor.model.kv_cache import as_bits

log = logging.getLogger("sangam.kv_transfer")

TRANSPORTS = ("gloo", "nccl")
CHUNK_BYTES = 256 << 20  # one message carries whole layers, at most this many bytes (or one layer)
WARMUP_TAG = 0  # the scheduler's tags start at 1
STORE_PREFIX = "sangam/kv"


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
    """The rendezvous store: one process hosts it (`is_master`), the others connect (retrying up to
    `timeout_s`)."""
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
        self.layers = [as_bits(layer) for layer in layers]  # FP8 as bytes, bit for bit
        first = self.layers[0]
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

    def handshake(self, tag: int, deadline: float, dropped: Callable[[], bool] = lambda: False) -> None:
        """Agree with the peer, through the store, that both ends post transfer `tag` now.

        Each end marks itself ready and polls for the peer until `deadline`; then it proposes "go" (the
        peer is there) or "abort" (it is not) with one atomic compare-and-set, and both ends follow the
        value that won. So an end that comes too late finds "abort" and neither end posts an operation that
        could never complete: a late peer costs one transfer, not the link (a gloo timeout closes the
        pair's connection; an unmatched NCCL send never finishes). An end whose transfer is `dropped`
        meanwhile (its peer was lost) stops waiting and proposes "abort" at once.
        """
        key = f"{STORE_PREFIX}/{self.src}-{self.dst}/{self.generation}/t{tag}"
        self.store.set(f"{key}/r{self.rank}", "1")
        peer_key = f"{key}/r{1 - self.rank}"
        pause, started = 0.0001, time.monotonic()
        while not (present := self.store.check([peer_key])) and (now := time.monotonic()) < deadline:
            if dropped():
                break
            time.sleep(pause)  # polls (not the store's wait, whose timeout would leave a reply in flight)
            pause = min(2 * pause, 0.001 if now - started < 0.1 else 0.01)
        decided = self.store.compare_set(f"{key}/go", "", "go" if present else "abort")
        refused = self._refusal(key) if present and decided != b"go" else ""
        if present or decided == b"go":  # the second end to decide removes the attempt's keys
            with contextlib.suppress(Exception):
                self.store.delete_key(peer_key)
            self._done_with(key)
        if decided != b"go":
            me, wait = self.src if self.rank == 0 else self.dst, f"{self.config.timeout_s:g} s"
            if refused:
                raise TransferError(f"worker {self.peer} refused the transfer: {refused}")
            if present:
                raise TransferError(
                    f"worker {me} reached the transfer after worker {self.peer} gave up ({wait})"
                )
            if dropped():
                raise TransferError(f"dropped while worker {me} waited for worker {self.peer}")
            raise TransferError(f"worker {self.peer} was not ready for the transfer within {wait}")

    def refuse(self, tag: int, reason: str) -> None:
        """This end will not take part in transfer `tag` (a receive with no room for its KV): decide
        "abort" for both ends now, with `reason`, and mark this end present, so that the peer's handshake
        ends at once with the reason instead of at its deadline."""
        key = f"{STORE_PREFIX}/{self.src}-{self.dst}/{self.generation}/t{tag}"
        self.store.set(f"{key}/why", reason)
        self.store.compare_set(f"{key}/go", "", "abort")  # before the mark: the peer must not decide "go"
        self.store.set(f"{key}/r{self.rank}", "1")
        self._done_with(key)

    def _done_with(self, key: str) -> None:
        """One end is done with the attempt's keys; the second removes them."""
        with contextlib.suppress(Exception):
            if self.store.add(f"{key}/n", 1) == 2:
                for name in ("go", "n", "why"):
                    self.store.delete_key(f"{key}/{name}")

    def _refusal(self, key: str) -> str:
        """The peer's reason if it refused the attempt, else ""."""
        with contextlib.suppress(Exception):
            if self.store.check([f"{key}/why"]):
                return bytes(self.store.get(f"{key}/why")).decode(errors="replace")
        return ""

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
    dropped: threading.Event = field(default_factory=threading.Event, compare=False)  # set: stop waiting
    refused: str = ""  # a receive this end will not take (why): the peer is told, nothing moves


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
        self.build_first = True  # build generation 0 at start (a restarted worker builds when first used)
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
            if self.build_first:
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
            if job.refused:
                self._refuse(job)
                continue
            try:
                result = self._transfer(job)
            except Exception as err:  # never lose a result: the scheduler waits for both ends
                log.exception("transfer %d failed unexpectedly", job.transfer_id)
                now = time.monotonic()
                result = TransferResult(self.sending, job, self.link.peer, False, one_line(err), now, now, 0)
            self.on_result(result)

    def _refuse(self, job: TransferJob) -> None:
        """Tell the peer that this end will not take `job` (its own failure was reported already)."""
        try:
            self.link.ensure(job.generation)
            self.link.refuse(job.tag, job.refused)
        except Exception as err:  # the peer's handshake then ends at its deadline, as before
            log.warning("could not refuse transfer %d: %s", job.transfer_id, one_line(err))

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
                self.link.handshake(job.tag, deadline, job.dropped.is_set)
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

    def connect(self, build: bool = True) -> None:
        """Build every link's first group (all in parallel); RuntimeError naming the first that failed.
        Without `build` (a restarted worker: its peers' groups with its old process are dead), each link
        is built at the generation of its first transfer, which the scheduler raised when it was lost."""
        for thread in self.links.values():
            thread.build_first = build
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

    def refuse(self, peer: int, job: TransferJob) -> None:
        """Tell `peer` that this worker will not receive `job` (`job.refused` says why), in its turn."""
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
