"""Prefill attention alone: one layer's non-causal attention of whole sequences, by kernel (one GPU).

Run on the accelerator machine, from the repository root (FlashInfer installed):

    python -m benchmarks.prefill_attention_speed [--models llada dream] [--shapes 2048 512,1536 4096]

A prefill recomputes every position of its sequence, so its queries attend to exactly the K/V this
forward computed. For each model's attention shape and each microbatch of prefills (`--shapes`: the
sequence lengths of one microbatch, comma-separated), q, k and v are strided views of one qkv output, as
the model hands them on, and each kernel is timed eagerly over `CALLS` back-to-back calls (the host ahead
of the GPU, as in a prefill's forward):

- `paged bf16` / `paged fp8`: FlashInfer's fa2 over the K/V stored in pages (bf16; FP8 read with fp16
  queries), what the executor ran before prefills attended over their own K/V;
- `ragged fa2` / `ragged fa3`: FlashInfer's ragged prefill over the K/V rows themselves (fa3: Hopper's);
- `triton MxN wW sS`: the executor's Triton kernel (`executor.model.prefill_kernel`) over the rows, with
  BLOCK_M x BLOCK_N, W warps and S stages (the first is the executor's `DEFAULT_CONFIG`; `--sweep` adds the
  others);
- `sdpa cudnn` / `sdpa flash`: torch's scaled_dot_product_attention per sequence with that backend only.

Each row gives us per call, TFLOP/s (4 * rows * KV * heads * head_dim per sequence) and the relative error
||o - o_ref|| / ||o_ref|| against fp32 attention over the same bf16 values. `first ms` is the wall time of
the kernel's first call at that shape (JIT builds, cuDNN plans). Only stdout is written.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.executor_speed import time_ms
from executor.model.attention import AttentionLayout, indptr
from executor.model.config import Family, full_size
from executor.model.flashinfer_backend import FlashInferAttention, shared_workspace
from executor.model.forward import SlotStore
from executor.model.fp8 import FP8
from executor.model.kv_cache import KVSlots
from executor.model.prefill_attention import TorchPrefillAttention
from executor.model.transformer import split_heads
from sangam.hardware import PAGE, pages_for

CALLS = 10
# (BLOCK_M, BLOCK_N, warps, stages) of the Triton kernel that --sweep adds to the executor's DEFAULT_CONFIG
TRITON_CONFIGS = ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 4), (64, 64, 4, 3))
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], object]


def pages_of(
    k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int], dtype: torch.dtype
) -> tuple[AttentionLayout, torch.Tensor]:
    """The K/V rows stored, as the executor stores them (`SlotStore`), in pages of `dtype` (consecutive
    pages per sequence), and their layout."""
    tables, slots, start = [], [], 0
    for length in lengths:
        tables.append(list(range(start, start + pages_for(length))))
        slots.append(KVSlots.of(tables[-1], torch.arange(length, device=k.device)))
        start += pages_for(length)
    kv = torch.zeros(start, 2, PAGE, k.shape[1], k.shape[2], dtype=dtype, device=k.device)
    SlotStore(KVSlots(torch.cat([s.pages for s in slots]), torch.cat([s.offsets for s in slots])))(kv, k, v)
    return AttentionLayout.build(lengths, lengths, tables), kv


def paged(lengths: Sequence[int], heads: int, kv_dtype: torch.dtype) -> Kernel:
    backend: FlashInferAttention | None = None
    store: dict[str, torch.Tensor] = {}

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> object:
        nonlocal backend
        if backend is None:
            layout, store["kv"] = pages_of(k, v, lengths, kv_dtype)
            backend = FlashInferAttention(heads, k.shape[1], k.shape[2], dtype=q.dtype, kv_dtype=kv_dtype)
            backend.plan(layout)
        out.copy_(backend.run(q, store["kv"]))
        return out

    return run


def ragged(lengths: Sequence[int], heads: int, fa: str) -> Kernel:
    flashinfer = importlib.import_module("flashinfer")
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(shared_workspace("cuda"), "NHD", backend=fa)
    planned = False

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> object:
        nonlocal planned
        if not planned:
            offsets = indptr(lengths).cuda()
            wrapper.plan(offsets, offsets, heads, k.shape[1], k.shape[2], causal=False,
                         q_data_type=q.dtype, kv_data_type=k.dtype, o_data_type=q.dtype)  # fmt: skip
            planned = True
        return wrapper.run(q, k, v, out=out)

    return run


def triton_kernel(lengths: Sequence[int], heads: int, config: tuple[int, int, int, int]) -> Kernel:
    module = importlib.import_module("executor.model.prefill_kernel")
    attention = None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> object:
        nonlocal attention
        if attention is None:
            attention = module.TritonPrefillAttention(
                heads, k.shape[1], k.shape[2], device=q.device, config=config
            )
            attention.plan(indptr(lengths))
        attention.run(q, k, v, out)
        return out

    return run


def sdpa(lengths: Sequence[int], backend: SDPBackend) -> Kernel:
    attention = TorchPrefillAttention()
    attention.plan(indptr(lengths))

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> object:
        with sdpa_kernel([backend]):
            attention.run(q, k, v, out)
        return out

    return run


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    sdpa(lengths, SDPBackend.MATH)(q.float(), k.float(), v.float(), out)
    return out


def kernels(lengths: Sequence[int], heads: int, sweep: bool) -> Iterator[tuple[str, Kernel]]:
    yield "paged bf16", paged(lengths, heads, torch.bfloat16)
    yield "paged fp8", paged(lengths, heads, FP8)
    yield "ragged fa2", ragged(lengths, heads, "fa2")
    default = importlib.import_module("executor.model.prefill_kernel").DEFAULT_CONFIG
    for m, n, warps, stages in (default, *(TRITON_CONFIGS if sweep else ())):
        yield f"triton {m}x{n} w{warps} s{stages}", triton_kernel(lengths, heads, (m, n, warps, stages))
    yield "sdpa cudnn", sdpa(lengths, SDPBackend.CUDNN_ATTENTION)
    yield "sdpa flash", sdpa(lengths, SDPBackend.FLASH_ATTENTION)
    yield "ragged fa3", ragged(lengths, heads, "fa3")  # last: its JIT build takes minutes


def bench(
    family: Family, lengths: Sequence[int], generator: torch.Generator, skip: Sequence[str], sweep: bool
) -> None:
    shape = full_size(family).shape
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    rows = sum(lengths)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=generator).to(torch.bfloat16).cuda()
    q, k, v = split_heads(qkv, heads, kv_heads, dim)
    expected = reference(q, k, v, lengths)
    flops = sum(4 * n * n * heads * dim for n in lengths)
    label = ",".join(map(str, lengths))
    for name, kernel in kernels(lengths, heads, sweep):
        if any(name.startswith(s) or name.endswith(s) for s in skip):
            continue
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        try:
            torch.cuda.synchronize()
            start = time.perf_counter()
            kernel(q, k, v, out)
            torch.cuda.synchronize()
            first = (time.perf_counter() - start) * 1e3
            us = time_ms(lambda kernel=kernel, out=out: [kernel(q, k, v, out) for _ in range(CALLS)], 2, 7)
            us *= 1e3 / CALLS
        except Exception as error:  # a kernel this machine cannot build or run: say so, go on
            print(f"{family.value:<6} {label:<12} {name:<20} failed: {str(error)[:300]}", flush=True)
            continue
        rel = float((out.float() - expected).norm() / expected.norm())
        print(
            f"{family.value:<6} {label:<12} {name:<20} {us:>9.1f} {flops / us / 1e6:>7.0f} {rel:>8.4f} "
            f"{first:>9.1f}",
            flush=True,
        )


def lengths_of(text: str) -> list[int]:
    """`--shapes`' one microbatch: positive sequence lengths, comma-separated."""
    try:
        lengths = [int(n) for n in text.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated positive lengths")
    return lengths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llada", "dream"], choices=[f.value for f in Family])
    parser.add_argument(
        "--shapes", nargs="+", type=lengths_of, default=[[2048], [512, 1536], [4096]],
        help="one microbatch's sequence lengths, comma-separated (512,1536), per shape",
    )  # fmt: skip
    parser.add_argument(
        "--skip", nargs="*", default=[], help="kernels to leave out (a name's first or last word)"
    )
    parser.add_argument("--sweep", action="store_true", help="time every Triton configuration")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(0)
    flashinfer = importlib.import_module("flashinfer")
    versions = (torch.__version__, torch.backends.cudnn.version(), flashinfer.__version__)
    print(f"{torch.cuda.get_device_name()}, torch / cuDNN / flashinfer {' / '.join(map(str, versions))}")
    print(
        f"{'model':<6} {'lengths':<12} {'kernel':<20} {'us':>9} {'TFLOP/s':>7} {'rel err':>8} {'first ms':>9}"
    )
    for family in (Family(m) for m in args.models):
        for shape in args.shapes:
            bench(family, shape, generator, args.skip, args.sweep)


if __name__ == "__main__":
    main()
