"""A timing shim for the reference implementation's servers, installed from outside (nothing in its tree is
edited): imported by this folder's sitecustomize when SANGAM_REF_TIMING_DIR or SANGAM_REF_KV_GLOO is set, it
wraps the methods listed in TARGETS as their modules are imported, in every process its launcher starts
(forked: they inherit the import hook).

SANGAM_REF_TIMING_DIR=DIR: each process appends one JSON line per event to DIR/<process name>-<pid>.jsonl,
times in nanoseconds of the system-wide monotonic clock (comparable across processes):

- colocated worker: `iter` per `_run_batch` (its GPU call `_do_run_mixed_iteration_local` as run on the GPU
  thread, the block checks inside it, the main thread's parts during it: checks, report RPC, report build,
  page frees; and the main thread's parts since the previous iteration ended: eviction, drains, admission,
  prefill collection, checks, with the admitted and freed requests); `enqueue` per `EnqueueRequest`;
  `recv_rpc` per `ReceiveKVCache` and `recv` per `_do_receive_kv_cache` (pages, bytes, staging parts);
  `capture` per CUDA-graph bucket;
- prefill worker: `pbatch` per `_process_batch` (its GPU call `_do_run_batched_prefill`, report RPC),
  `trigger_rpc` per `TriggerKVTransfer` handled, `coord` per `_coordinate_kv_transfer` thread, `send` per
  `_do_transfer_retained_kv` (pages, bytes, staging parts);
- scheduler: `call` per `_timed_grpc_call` (its `TriggerKVTransfer`, on the event loop), `dispatch` per
  `_submit_enqueue_async`, `handler` per report / transfer / arrival event handled on the loop.

SANGAM_REF_KV_GLOO=1: the KV process group is made with gloo instead of NCCL (NCCL refuses two ranks on one
device), and a CUDA tensor sent or received through it is staged through pinned host memory (gloo reads
host pointers); the control path is untouched. Transfer times then measure that path, not NVLink or PCIe.

`python3 -P -m ref_timing check` (in the reference's process) imports every target and checks that each
exists with the parameters the wrappers expect.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

CLOCK: Callable[[], int] = time.monotonic_ns  # tests replace it


class Target:
    """One wrapped attribute: where it is, the parameters it must take, and what its wrapper records."""

    def __init__(self, module: str, cls: str, attr: str, params: Sequence[str], kind: str) -> None:
        self.module, self.cls, self.attr, self.params, self.kind = module, cls, attr, tuple(params), kind


_CW = "sangam.worker.colocated_worker"
_PW = "sangam.worker.prefill_worker"
_HS = "sangam.engine.hybrid_scheduler"
_CS = "sangam.engine.colocated_scheduler"
TARGETS: tuple[Target, ...] = (
    Target(_CW, "ColocatedWorkerServicer", "_run_batch", ("self", "prefill_batch", "decode_reqs"), "iter"),
    Target(
        _CW,
        "ColocatedWorkerServicer",
        "_do_run_mixed_iteration_local",
        ("self", "prefill_batch", "decode_reqs"),
        "gpu",
    ),
    Target(_CW, "ColocatedWorkerServicer", "_block_is_complete", ("block_tokens", "mask_id"), "check"),
    Target(_CW, "ColocatedWorkerServicer", "_report_batch", ("self", "batch"), "part"),
    Target(
        _CW,
        "ColocatedWorkerServicer",
        "_make_batch_report",
        (
            "self",
            "batch_phase",
            "batch_size",
            "prompt_len",
            "gen_len",
            "batch_start_time",
            "batch_end_time",
            "num_unmasked_tokens",
            "sampling_duration",
            "batch_op_attn_time",
            "batch_op_mlp_time",
            "batch_op_qkv_time",
            "request_updates",
            "worker_state_after",
        ),
        "part",
    ),
    Target(_CW, "ColocatedWorkerServicer", "_do_free_state", ("self", "req_id"), "free"),
    Target(_CW, "ColocatedWorkerServicer", "_evict_completed", ("self",), "part"),
    Target(_CW, "ColocatedWorkerServicer", "_drain_incoming", ("self",), "part"),
    Target(_CW, "ColocatedWorkerServicer", "_drain_external_decodes", ("self",), "part"),
    Target(_CW, "ColocatedWorkerServicer", "_admit_ready_decode_requests", ("self",), "admit"),
    Target(_CW, "ColocatedWorkerServicer", "_collect_prefill_batch", ("self",), "part"),
    Target(_CW, "ColocatedWorkerServicer", "EnqueueRequest", ("self", "request", "context"), "enqueue"),
    Target(_CW, "ColocatedWorkerServicer", "ReceiveKVCache", ("self", "request", "context"), "recv_rpc"),
    Target(
        _CW, "ColocatedWorkerServicer", "_do_receive_kv_cache", ("self", "request", "recv_stream"), "recv"
    ),
    Target(
        "sangam.model.cuda_graph_runner",
        "DecodeCudaGraphRunner",
        "_capture_bucket",
        ("self", "bucket"),
        "capture",
    ),
    Target(_PW, "PrefillWorkerServicer", "_process_batch", ("self", "batch"), "pbatch"),
    Target(_PW, "PrefillWorkerServicer", "_do_run_batched_prefill", ("self", "batch_items"), "gpu"),
    Target(_PW, "PrefillWorkerServicer", "_report_batch", ("self", "batch"), "part"),
    Target(_PW, "PrefillWorkerServicer", "TriggerKVTransfer", ("self", "request", "context"), "trigger_rpc"),
    Target(_PW, "PrefillWorkerServicer", "_coordinate_kv_transfer", ("self", "request"), "coord"),
    Target(
        _PW, "PrefillWorkerServicer", "_do_transfer_retained_kv", ("self", "request_id", "dst_rank"), "send"
    ),
    Target(_HS, "HybridScheduler", "_timed_grpc_call", ("self", "stub_fn", "request", "rpc_name"), "call"),
    Target(
        _HS,
        "HybridScheduler",
        "_submit_enqueue_async",
        ("self", "stub_fn", "request", "worker_id", "worker_type"),
        "dispatch",
    ),
    Target(_HS, "HybridScheduler", "_on_batch_metrics", ("self", "report"), "handler"),
    Target(_HS, "HybridScheduler", "_on_kv_transfer", ("self", "report"), "handler"),
    Target(_HS, "HybridScheduler", "_on_request_arrived", ("self", "req"), "handler"),
    Target(
        _CS,
        "ColocatedScheduler",
        "_submit_enqueue_async",
        ("self", "stub_fn", "request", "worker_id", "worker_type"),
        "dispatch",
    ),
    Target(_CS, "ColocatedScheduler", "_on_batch_metrics", ("self", "report"), "handler"),
    Target(_CS, "ColocatedScheduler", "_on_request_arrived", ("self", "req"), "handler"),
)
# what the gloo switch replaces: torch.distributed's, called by sangam.kv_cache.kv_cache_transfer
GLOO_TARGETS = {
    "init_process_group": ("backend", "world_size", "rank", "device_id"),
    "isend": ("tensor", "dst"),
    "recv": ("tensor", "src"),
}


# ----- the log -----------------------------------------------------------------------------------------


class Log:
    """One JSONL file per process, opened on first write (after the launcher's fork)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.lock = threading.Lock()
        self.pid = -1
        self.file: Any = None

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self.lock:
            if self.pid != os.getpid():
                import multiprocessing

                self.pid = os.getpid()
                name = multiprocessing.current_process().name.replace("/", "_")
                self.file = open(os.path.join(self.folder, f"{name}-{self.pid}.jsonl"), "a", buffering=1)  # noqa: SIM115
            self.file.write(line + "\n")


LOG: Log | None = None
_local = threading.local()


def _acc() -> dict[str, Any]:
    """This thread's parts since its last scope: name -> [ns, calls], and the lists kept beside them."""
    acc = getattr(_local, "acc", None)
    if acc is None:
        acc = _local.acc = {}
    return acc


def _take() -> dict[str, Any]:
    acc = _acc()
    _local.acc = {}
    return acc


def _add(name: str, ns: int) -> None:
    part = _acc().setdefault(name, [0, 0])
    part[0] += ns
    part[1] += 1


def _emit(ev: str, **fields: Any) -> None:
    if LOG is not None:
        LOG.write({"ev": ev, "thread": threading.current_thread().name, **fields})


def _items(reqs: Sequence[Any]) -> list[list[Any]]:
    """[request id, block index, tokens] of prefill requests (protos or batch items)."""
    out = []
    for r in reqs:
        rid = getattr(r, "request_id", None) or getattr(r, "req_id", "")
        seq = getattr(r, "sequence_ids", None)
        if seq is None:
            seq = getattr(r, "sequence", ())
        out.append([rid, int(getattr(r, "block_index", -1)), len(seq)])
    return out


def _page_bytes(layers: Sequence[Any]) -> int:
    """Bytes of one page across every layer of a pool's kv_data."""
    return sum(t[0].numel() * t[0].element_size() for t in layers)


# ----- the wrappers, by kind ---------------------------------------------------------------------------


def _wrap(target: Target, fn: Callable[..., Any]) -> Callable[..., Any]:
    kind, name = target.kind, target.attr

    def timed_part(*args: Any, **kwargs: Any) -> Any:
        t0 = CLOCK()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(name, CLOCK() - t0)

    def admit(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = {id(r) for r in self._active_batch}
        t0 = CLOCK()
        try:
            return fn(self, *args, **kwargs)
        finally:
            t1 = CLOCK()
            _add(name, t1 - t0)
            new = [[r.request_id, int(r.block_index), t1] for r in self._active_batch if id(r) not in before]
            _acc().setdefault("admitted", []).extend(new)

    def free(self: Any, req_id: str) -> Any:
        t0 = CLOCK()
        try:
            return fn(self, req_id)
        finally:
            t1 = CLOCK()
            _add(name, t1 - t0)
            _acc().setdefault("freed", []).append([req_id, t1])

    def gpu(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = _take()
        t0 = CLOCK()
        try:
            return fn(self, *args, **kwargs)
        finally:
            t1 = CLOCK()
            inner = _take()
            _local.acc = saved
            self.__dict__["_refloops_gpu"] = {"t0": t0, "t1": t1, "parts": inner}

    def scope(self: Any, batch: Any, *rest: Any) -> Any:
        before = _take()
        self.__dict__.pop("_refloops_gpu", None)
        t0 = CLOCK()
        try:
            return fn(self, batch, *rest)
        finally:
            t1 = CLOCK()
            record: dict[str, Any] = {
                "t0": t0,
                "t1": t1,
                "gpu": self.__dict__.pop("_refloops_gpu", None),
                "parts": _take(),
                "before": before,
            }
            if kind == "iter":
                record["prefills"] = _items(batch)
                record["decodes"] = [[r.request_id, int(r.block_index)] for r in rest[0]]
            else:
                record["prefills"] = _items([b[0] for b in batch])
            _emit(kind, **record)

    def event(self: Any, request: Any, *rest: Any) -> Any:
        t0 = CLOCK()
        saved = _take() if kind in ("recv", "send") else None
        extra: dict[str, Any] = {}
        try:
            if kind == "send":
                with self._retained_lock:
                    pages = len(self._retained_requests[request].kv_state.page_ids)
                extra = {
                    "rid": request,
                    "pages": pages,
                    "bytes": pages * _page_bytes(self._prefill_kv_pool.kv_data),
                }
            elif kind == "call":
                extra = {
                    "rpc": rest[1],
                    "rid": getattr(rest[0], "request_id", ""),
                    "block": int(getattr(rest[0], "block_index", -1)),
                }
            elif kind == "dispatch":
                extra = {"rid": rest[0].request_id, "block": int(rest[0].block_index), "worker_type": rest[2]}
            elif kind == "handler":
                extra = {
                    "handler": name,
                    "worker": getattr(request, "worker_id", ""),
                    "rid": getattr(request, "request_id", ""),
                }
            else:
                extra = {
                    "rid": getattr(request, "request_id", ""),
                    "block": int(getattr(request, "block_index", -1)),
                }
            return fn(self, request, *rest)
        finally:
            t1 = CLOCK()
            if kind == "recv":
                pool = self._kv_pool
                pages = -(-int(request.seq_length) // pool.page_size)
                extra.update(
                    seq_len=int(request.seq_length), pages=pages, bytes=pages * _page_bytes(pool.kv_data)
                )
            if saved is not None:
                extra["parts"] = _take()
                _local.acc = saved
            _emit(kind, t0=t0, t1=t1, **extra)

    def capture(self: Any, bucket: Any) -> Any:
        t0 = CLOCK()
        try:
            return fn(self, bucket)
        finally:
            _emit("capture", t0=t0, t1=CLOCK(), batch_size=int(bucket.batch_size))

    if kind == "check":

        def check(block_tokens: Any, mask_id: int) -> bool:
            return bool(timed_part(block_tokens, mask_id))

        return staticmethod(check)  # type: ignore[return-value]
    chosen = {
        "part": timed_part,
        "admit": admit,
        "free": free,
        "gpu": gpu,
        "iter": scope,
        "pbatch": scope,
        "capture": capture,
    }.get(kind, event)
    chosen.__wrapped__ = fn  # type: ignore[attr-defined]
    return chosen


def patch_module(module: Any) -> list[str]:
    """Wrap every target of `module` in place; the names wrapped."""
    done = []
    for target in TARGETS:
        if target.module != module.__name__:
            continue
        cls = getattr(module, target.cls)
        raw = inspect.getattr_static(cls, target.attr)
        fn = raw.__func__ if isinstance(raw, staticmethod) else raw
        setattr(cls, target.attr, _wrap(target, fn))
        done.append(f"{target.cls}.{target.attr}")
    return done


# ----- the gloo switch ---------------------------------------------------------------------------------


def patch_gloo(dist: Any, torch: Any) -> None:
    """Make the KV group gloo and stage CUDA tensors through pinned host memory on its sends and receives."""
    init, isend, recv = dist.init_process_group, dist.isend, dist.recv

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["backend"] = "gloo"
        kwargs.pop("device_id", None)
        return init(*args, **kwargs)

    class Staged:
        """A gloo send's work, holding its host copy until it is waited on."""

        def __init__(self, work: Any, host: Any) -> None:
            self.work, self.host = work, host

        def wait(self, *args: Any) -> Any:
            t0 = CLOCK()
            try:
                return self.work.wait(*args)
            finally:
                _add("gloo_wait", CLOCK() - t0)

    def staged_isend(tensor: Any, dst: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if not tensor.is_cuda:
            return isend(tensor, dst, *args, **kwargs)
        t0 = CLOCK()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor)
        _add("stage_d2h", CLOCK() - t0)
        return Staged(isend(host, dst, *args, **kwargs), host)

    def staged_recv(tensor: Any, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        if not tensor.is_cuda:
            return recv(tensor, src, *args, **kwargs)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        t0 = CLOCK()
        out = recv(host, src, *args, **kwargs)
        t1 = CLOCK()
        tensor.copy_(host)
        _add("gloo_recv", t1 - t0)
        _add("stage_h2d", CLOCK() - t1)
        return out

    for wrapper, original in ((init_process_group, init), (staged_isend, isend), (staged_recv, recv)):
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    dist.init_process_group, dist.isend, dist.recv = init_process_group, staged_isend, staged_recv


# ----- installing: wrap each target module once it is imported -----------------------------------------


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the watched modules through the other finders and runs `then(module)` once each is executed."""

    def __init__(self, watched: dict[str, Callable[[Any], Any]]) -> None:
        self.watched = watched

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        then = self.watched.pop(name, None)
        if then is None:
            return None
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Watch the target modules (and, with SANGAM_REF_KV_GLOO, the KV transfer module) from now on."""
    global LOG
    folder = os.environ.get("SANGAM_REF_TIMING_DIR")
    watched: dict[str, Callable[[Any], Any]] = {}
    if folder:
        os.makedirs(folder, exist_ok=True)
        LOG = Log(folder)
        for module in {t.module for t in TARGETS}:
            watched[module] = patch_module
    if os.environ.get("SANGAM_REF_KV_GLOO"):

        def gloo(module: Any) -> None:
            patch_gloo(module.dist, module.torch)

        watched["sangam.kv_cache.kv_cache_transfer"] = gloo
    if watched:
        sys.meta_path.insert(0, _AfterImport(watched))


def check() -> int:
    """Import every target; print one line per target, and return 1 if any is missing or changed."""
    bad = 0
    for target in TARGETS:
        try:
            cls = getattr(importlib.import_module(target.module), target.cls)
            params = tuple(
                inspect.signature(
                    inspect.getattr_static(cls, target.attr).__func__
                    if target.kind == "check"
                    else getattr(cls, target.attr)
                ).parameters
            )
        except Exception as err:  # any failure is one line, not a traceback
            params, note = (), f"{type(err).__name__}: {err}"
        else:
            note = "ok" if params == target.params else f"takes {params}, expected {target.params}"
        bad += note != "ok"
        where = f"{target.module}.{target.cls}.{target.attr}"
        print(f"{'ok ' if note == 'ok' else 'BAD'} {where} [{target.kind}] {note}")
    dist = importlib.import_module("torch.distributed")
    for attr, needed in GLOO_TARGETS.items():
        params = tuple(inspect.signature(getattr(dist, attr)).parameters)
        ok = all(p in params for p in needed)
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} torch.distributed.{attr} {params}")
    transfer = importlib.import_module("sangam.kv_cache.kv_cache_transfer")
    for attr in ("dist", "torch"):
        ok = hasattr(transfer, attr)
        bad += not ok
        print(
            f"{'ok ' if ok else 'BAD'} sangam.kv_cache.kv_cache_transfer.{attr} (the gloo switch patches it)"
        )
    installed = 0
    if LOG is not None:  # installed from the environment: every target must now be a wrapper
        for target in TARGETS:
            raw = inspect.getattr_static(
                getattr(importlib.import_module(target.module), target.cls), target.attr
            )
            wrapped = hasattr(getattr(raw, "__func__", raw), "__wrapped__") or target.kind == "check"
            bad += not wrapped
            installed += 1
        staged = getattr(dist.isend, "__name__", "") == "staged_isend"
        if os.environ.get("SANGAM_REF_KV_GLOO"):
            bad += not staged
        print(
            f"installed: {installed} targets checked for wrappers; gloo staging {'on' if staged else 'off'}"
        )
    print(f"check: {len(TARGETS) + len(GLOO_TARGETS) + 2 + installed - bad} ok, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:] != ["check"]:
        raise SystemExit("usage: python3 -P -m ref_timing check   (in the reference's process)")
    import ref_timing  # the instance sitecustomize installed, not this __main__ copy

    sys.exit(ref_timing.check())
