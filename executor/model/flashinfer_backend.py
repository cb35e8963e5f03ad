"""FlashInfer attention on CUDA: the `AttentionBackend` the live worker uses on a GPU.

`FlashInferAttention` wraps FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` over the cache's paged NHD
layout (`(pages, 2, PAGE, kv_heads, head_dim)`, K and V stacked on dim 1, exactly what `PagedKVCache` stores).
It is planned once per microbatch from the `AttentionLayout` CSR arrays (host int32 tensors, so `plan` never
waits on the GPU) and run once per layer. Attention is non-causal and pinned to the fa2 backend: another
FlashInfer backend is known to be wrong for non-causal attention on this card (docs/design.md section 5).

FlashInfer is imported lazily, so CPU installs never need it; `make_backend` picks FlashInfer on CUDA (half
precision) and `TorchAttention` everywhere else. A `cuda_graph_batch` instance keeps its CSR arrays in fixed
device buffers, as FlashInfer requires for CUDA-graph capture (`executor.model.cuda_graphs`).

FlashInfer JIT-compiles its kernels on first use (about 70 s for the attention module on a fresh H200) into
`~/.cache/flashinfer`; `warm_up_kernels` compiles every module the executor uses at once, in parallel.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from executor.model.attention import AttentionBackend, AttentionLayout, TorchAttention, same_layout
from executor.model.config import ModelConfig
from executor.model.fp8 import FP8
from sangam.hardware import PAGE

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace (split-KV partial results)
HALF_DTYPES = (torch.float16, torch.bfloat16)
KV_DTYPES = (*HALF_DTYPES, FP8)  # fa2 reads FP8 pages under fp16 queries (`query_dtype`)
FA2 = "fa2"  # pinned: correct for causal=False on Hopper (docs/design.md section 5)
REPLAN_VERSION = "0.6.3"  # `FlashInferAttention._replan` is written against this version's wrapper internals


@functools.cache
def flashinfer_module() -> ModuleType | None:
    """The `flashinfer` package, or None where it is not installed or cannot load (CPU installs)."""
    try:
        return importlib.import_module("flashinfer")
    except Exception as error:  # ImportError, or a broken CUDA/tvm-ffi install: fall back to torch
        log.debug("flashinfer unavailable: %s", error)
        return None


def flashinfer_available() -> bool:
    return flashinfer_module() is not None


def replans_supported() -> bool:
    """Whether graph wrappers can replan through the planner alone and plan exact grids (FlashInfer 0.6.3)."""
    module = flashinfer_module()
    return module is not None and getattr(module, "__version__", "") == REPLAN_VERSION


def supports(device: torch.device | str, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> bool:
    """Whether FlashInfer can serve attention for this device, q dtype and KV dtype (None: q's)."""
    on_cuda = torch.device(device).type == "cuda"
    return on_cuda and dtype in HALF_DTYPES and (kv_dtype or dtype) in KV_DTYPES and flashinfer_available()


def query_dtype(dtype: torch.dtype, kv_dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel reads queries in: fp16 over FP8 pages, else the queries' own.

    fa2 widens each FP8 page to the query dtype in its inner loop: to fp16 in one Hopper instruction, to
    bf16 through bit arithmetic that made attention over FP8 pages 2.5x slower than over bf16 pages on an
    H200, against 1.5x with fp16 queries (`benchmarks/kv_attention_speed.py`, docs/executor-performance.md).
    The output stays in the queries' dtype."""
    return torch.float16 if kv_dtype == FP8 else dtype


def _require() -> ModuleType:
    module = flashinfer_module()
    if module is None:
        raise RuntimeError(
            "FlashInfer is not installed (pip install flashinfer-python==0.6.3 apache-tvm-ffi)"
        )
    return module


_workspaces: dict[torch.device, Tensor] = {}
_workspace_lock = threading.Lock()


def shared_workspace(device: torch.device | str) -> Tensor:
    """One 128 MiB float workspace per device, shared by every wrapper: they run one after another."""
    device = torch.device(device)
    if str(device) == "cuda":  # no index: the current device
        device = torch.device("cuda", torch.cuda.current_device())
    with _workspace_lock:
        if device not in _workspaces:
            _workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return _workspaces[device]


class FlashInferAttention:
    """Non-causal paged attention of one microbatch through FlashInfer's batch-prefill kernel (fa2).

    `plan(layout)` runs once per microbatch on the layout's host CSR arrays; `run(q, kv_layer)` once per
    layer, with q `(T, heads, head_dim)` (strided rows are fine) and `kv_layer` one `PagedKVCache` layer; over
    FP8 pages the kernel reads the queries in fp16 (`query_dtype`) and writes the output in q's dtype.
    With `cuda_graph_batch=b` the wrapper keeps the CSR arrays in fixed device buffers sized for exactly `b`
    items and at most `max_pages` pages, so `run` can be captured in a CUDA graph and `plan` redone before
    every replay.
    """

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        kv_dtype: torch.dtype | None = None,
        device: torch.device | str = "cuda",
        workspace: Tensor | None = None,
        cuda_graph_batch: int | None = None,
        max_pages: int = 0,
        exact_grid: bool = False,
    ) -> None:
        flashinfer = _require()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.dtype, self.kv_dtype = dtype, kv_dtype or dtype
        self.query_dtype = query_dtype(self.dtype, self.kv_dtype)
        if self.dtype not in HALF_DTYPES or self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"FlashInfer attention needs fp16/bf16 q and fp16/bf16/fp8 KV, not "
                f"{self.dtype}/{self.kv_dtype}"
            )
        self.device = torch.device(device)
        self.workspace = shared_workspace(self.device) if workspace is None else workspace
        self.cuda_graph_batch = cuda_graph_batch
        buffers: dict[str, Any] = {}
        if cuda_graph_batch is not None:
            if cuda_graph_batch < 1 or max_pages < cuda_graph_batch:
                raise ValueError(f"a graph wrapper needs >= 1 item and >= 1 page per item, not {max_pages}")

            def int32(length: int) -> Tensor:
                return torch.zeros(length, dtype=torch.int32, device=self.device)

            buffers = {
                "use_cuda_graph": True,
                "qo_indptr_buf": int32(cuda_graph_batch + 1),
                "paged_kv_indptr_buf": int32(cuda_graph_batch + 1),
                "paged_kv_indices_buf": int32(max_pages),
                "paged_kv_last_page_len_buf": int32(cuda_graph_batch),
            }
        if exact_grid and cuda_graph_batch is None:
            raise ValueError("an exact grid is a CUDA-graph plan: give cuda_graph_batch")
        self._replans = cuda_graph_batch is not None and replans_supported()
        if exact_grid and not self._replans:
            raise ValueError(f"exact grids need FlashInfer {REPLAN_VERSION}")
        self.exact_grid = exact_grid
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=FA2, **buffers
        )
        self._planned: AttentionLayout | None = None
        self._grid: list[int] | None = None  # an exact grid's plan info, fixed at its first plan

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        *,
        dtype: torch.dtype = torch.bfloat16,
        kv_dtype: torch.dtype | None = None,
        device: torch.device | str = "cuda",
        **kwargs: Any,
    ) -> FlashInferAttention:
        return cls(
            config.shape.heads,
            config.shape.kv_heads,
            config.shape.head_dim,
            dtype=dtype,
            kv_dtype=kv_dtype,
            device=device,
            **kwargs,
        )

    def plan(self, layout: AttentionLayout) -> None:
        if self._planned is not None and same_layout(self._planned, layout):
            return  # the buffers still hold this very plan (a block's next decode step)
        if self._replans and self._planned is not None:
            self._replan(layout)
        else:
            self._wrapper.plan(
                layout.qo_indptr,
                layout.kv_indptr,
                layout.kv_indices,
                layout.kv_last_page_len,
                self.heads,
                self.kv_heads,
                self.head_dim,
                PAGE,
                causal=False,
                q_data_type=self.query_dtype,
                kv_data_type=self.kv_dtype,
                o_data_type=self.dtype,
            )
            if self.exact_grid:
                self._replan(layout)
        self._planned = layout

    def _replan(self, layout: AttentionLayout) -> None:
        """Plan into a graph wrapper's fixed buffers through FlashInfer's planner alone.

        `BatchPrefillWithPagedKVCacheWrapper.plan` (0.6.3) spends most of its host time outside the planner:
        Python's `max()` over every plan entry, one tensor op per element. The wrapper is already set up by
        its first `plan`; what a replan changes is exactly this: the CSR buffers, the KV lengths and the
        plan info the kernels read. An exact grid plans as FlashInfer does outside graphs with KV
        unsplit: one work tile per item and query tile, so its launch shape (baked into the graph) depends
        on the item count and rows only, which is checked here.
        """
        wrapper = self._wrapper
        kv_lens = layout.kv_len_tensor()
        wrapper._qo_indptr_buf.copy_(layout.qo_indptr, non_blocking=True)
        wrapper._paged_kv_indptr_buf.copy_(layout.kv_indptr, non_blocking=True)
        wrapper._paged_kv_last_page_len_buf.copy_(layout.kv_last_page_len, non_blocking=True)
        wrapper._paged_kv_indices_buf[: len(layout.kv_indices)].copy_(layout.kv_indices, non_blocking=True)
        wrapper._kv_lens_buffer[: len(kv_lens)].copy_(kv_lens, non_blocking=True)
        rows = int(layout.qo_indptr[-1]) if self.exact_grid else wrapper._max_total_num_rows
        info = wrapper._cached_module.plan(
            wrapper._float_workspace_buffer,
            wrapper._int_workspace_buffer,
            wrapper._pin_memory_int_workspace_buffer,
            layout.qo_indptr,
            layout.kv_indptr,
            kv_lens,
            rows,
            layout.num_items,
            self.heads,
            self.kv_heads,
            PAGE,
            not self.exact_grid,  # enable_cuda_graph
            self.head_dim,
            self.head_dim,
            False,  # causal
            -1,  # window_left
            -1,  # fixed_split_size
            self.exact_grid,  # disable_split_kv
            0,  # num_colocated_ctas
        )
        if self.exact_grid:
            if self._grid is None:
                self._grid = list(info)
            elif list(info) != self._grid:
                raise RuntimeError(f"exact-grid plan changed shape: {list(info)} against {self._grid}")
        wrapper._plan_info = info
        wrapper._max_kv_len = int(kv_lens.max())

    def run(self, q: Tensor, kv_layer: Tensor) -> Tensor:
        # An explicit output saves the memset FlashInfer does when it allocates one (torch.zeros).
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        result: Tensor = self._wrapper.run(q.to(self.query_dtype), kv_layer, out=out)
        return result


class FlashInferPrefillAttention:
    """FlashInfer's `BatchPrefillWithRaggedKVCacheWrapper` on its fa2 backend, non-causal (pinned as the
    paged backend is: docs/design.md section 5). It runs the module of bf16 (fp16) q, K/V and output, which
    over FP8 pages is built beside the paged one (`warm_up_kernels`)."""

    def __init__(
        self, heads: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        if dtype not in HALF_DTYPES:
            raise ValueError(f"FlashInfer prefill attention needs fp16/bf16, not {dtype}")
        self.heads, self.kv_heads, self.head_dim, self.dtype = heads, kv_heads, head_dim, dtype
        self._wrapper = _require().BatchPrefillWithRaggedKVCacheWrapper(
            shared_workspace(device), "NHD", backend=FA2
        )

    def plan(self, indptr: Tensor) -> None:
        self._wrapper.plan(
            indptr,
            indptr,
            self.heads,
            self.kv_heads,
            self.head_dim,
            causal=False,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            o_data_type=self.dtype,
        )

    def run(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
        self._wrapper.run(q, k, v, out=out)


def make_backend(
    device: torch.device | str,
    config: ModelConfig,
    *,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """FlashInfer on a CUDA device in fp16/bf16 (KV also FP8) when it is installed; the torch reference
    otherwise."""
    if supports(device, dtype, kv_dtype):
        return FlashInferAttention.for_model(config, dtype=dtype, kv_dtype=kv_dtype, device=device)
    if torch.device(device).type == "cuda" and dtype in HALF_DTYPES:
        log.warning("FlashInfer is not installed: attention falls back to the (slow) torch backend on CUDA")
    return TorchAttention()


def warm_up_kernels(
    device: torch.device | str = "cuda",
    *,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    head_dims: tuple[int, ...] = (128,),
) -> dict[str, float]:
    """JIT-compile (or load from the cache) every FlashInfer module the executor uses, in parallel threads.

    The modules: fa2 batch prefill for each head_dim over `kv_dtype` pages (None: `dtype`'s), over FP8 pages
    also over `dtype` K/V rows (`FlashInferPrefillAttention`), RMSNorm, SiLU-and-mul, RoPE with a cos/sin
    cache and the paged K/V store.
    Returns seconds per module. Each build is a ninja subprocess, so threads overlap them.
    """
    import time

    flashinfer = _require()
    device = torch.device(device)
    torch.zeros(1, device=device)  # initialise CUDA once, before the threads

    def attention(head_dim: int) -> None:
        backend = FlashInferAttention(2, 1, head_dim, dtype=dtype, kv_dtype=kv_dtype, device=device)
        kv = torch.randn(2, 2, PAGE, 1, head_dim, dtype=dtype, device=device).to(kv_dtype or dtype)
        backend.plan(AttentionLayout.build([3], [20], [[0, 1]]))
        backend.run(torch.randn(3, 2, head_dim, dtype=dtype, device=device), kv)

    def prefill(head_dim: int) -> None:
        backend = FlashInferPrefillAttention(2, 1, head_dim, dtype=dtype, device=device)
        backend.plan(torch.tensor([0, 3], dtype=torch.int32))
        q, kv = (
            torch.randn(3, 2, head_dim, dtype=dtype, device=device),
            torch.randn(3, 1, head_dim, dtype=dtype, device=device),
        )
        backend.run(q, kv, kv, torch.empty_like(q))

    def norm() -> None:
        x = torch.randn(4, 256, dtype=dtype, device=device)
        flashinfer.rmsnorm(x, torch.ones(256, dtype=dtype, device=device), 1e-6)

    def activation() -> None:
        flashinfer.silu_and_mul(torch.randn(4, 512, dtype=dtype, device=device))

    def rope() -> None:
        q = torch.randn(4, 2, 128, dtype=dtype, device=device)
        k = torch.randn(4, 1, 128, dtype=dtype, device=device)
        rows = torch.arange(4, dtype=torch.int32, device=device)
        cache = torch.randn(4, 128, dtype=torch.float32, device=device)
        flashinfer.apply_rope_with_cos_sin_cache_inplace(rows, q, k, 128, cache, is_neox=True)

    def page() -> None:
        kv = torch.zeros(2, 2, PAGE, 1, 128, dtype=dtype, device=device)
        rows = torch.zeros(3, dtype=torch.int32, device=device)
        k = torch.randn(3, 1, 128, dtype=dtype, device=device)
        bounds = torch.tensor([0, 1], dtype=torch.int32, device=device)
        flashinfer.append_paged_kv_cache(k, k, rows, rows, kv, rows[:1], bounds, bounds[1:])

    jobs: dict[str, Any] = {f"attention_hd{d}": functools.partial(attention, d) for d in head_dims}
    if kv_dtype == FP8:  # prefills attend over their own rows (executor.model.prefill_attention)
        jobs |= {f"prefill_hd{d}": functools.partial(prefill, d) for d in head_dims}
    jobs |= {"rmsnorm": norm, "silu_and_mul": activation, "rope": rope, "append_paged_kv": page}
    seconds: dict[str, float] = {}
    failed: list[str] = []

    def timed(name: str) -> None:
        start = time.perf_counter()
        try:
            jobs[name]()
            torch.cuda.synchronize(device)
        except Exception:
            failed.append(name)
        seconds[name] = time.perf_counter() - start

    threads = [threading.Thread(target=timed, args=(name,)) for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in list(failed):  # retried alone, so that a real error surfaces plainly
        start = time.perf_counter()
        jobs[name]()
        torch.cuda.synchronize(device)
        seconds[name] = time.perf_counter() - start
    return seconds
