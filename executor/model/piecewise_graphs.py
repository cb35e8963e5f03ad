"""CUDA graphs for eager forwards: the model body captured in pieces between its attention calls.

An eager FP8 forward launches about twenty kernels a layer from Python: 15-30 ms of host time, more than
the GPU time of a small prefill, and a live worker's busier host falls behind the GPU in its mixed steps
(docs/executor-performance.md). Everything in a layer but attention depends on the microbatch's token count
only, so `PiecewiseGraphs` captures, per token-count bucket, the stretches between two attention calls as
CUDA graphs; attention stays eager, because its layout (items, lengths, pages) changes at every step.

Per bucket of B rows, graph 0 runs the embedding, layer 0's norm, q/k/v projection and RoPE; graph i
(1 .. L-1) takes layer i-1's attention output from the static `attended` rows and runs its output
projection, its MLP and layer i's norm, q/k/v projection and RoPE; graph L runs the last output projection
and MLP and copies the MLP output and the residual stream out. Every layer's q/k/v projection writes into
the same static `qkv` rows and RoPE rotates them in place, so the attention between graphs reads q, k and v
where the graph left them and writes its output into the static `attended` rows (an `AttentionInto`: over
the first T rows, storing their K/V, then attending). The LM head runs eagerly on the rows it reads. The
buckets share one memory pool and their static rows; replays never interleave, so what one bucket's graphs
leave in the pool is dead before another's run.

A microbatch of T tokens runs in the smallest bucket of at least T rows; rows T .. B hold stale tokens and
values. Every op but attention works row by row and attention sees only the first T rows, so no real row
depends on them, and their K/V are never stored. Buckets are multiples of 128 rows, the FP8 GEMMs' row tile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from executor.model.transformer import Transformer, split_heads


class AttentionInto(Protocol):
    """A `LayerAttention` that writes its output into `out` (T, heads, d), apart from q, k and v, and
    returns it."""

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> Tensor: ...


ROWS = 128  # bucket step: the row tile of the FP8 GEMMs, so padding to it adds no GEMM tiles
MAX_ROWS = 4096  # the largest bucket: live FP8 microbatches held at most 3,371 tokens (the seventh round)


def bucket_rows(tokens: int, buckets: Sequence[int]) -> int | None:
    """The smallest of `buckets` (ascending) holding `tokens` rows, or None."""
    return next((rows for rows in buckets if rows >= tokens), None)


class PiecewiseGraphs:
    """The body of `model` captured per bucket of `buckets` rows (multiples of `ROWS`), largest first.

    `run(tokens, positions, attend)` replays the smallest bucket holding the microbatch, attention eager
    between the graphs, and returns the body's output rows (delta, residual) as `Transformer.body` does, as
    views of static rows that the next `run` overwrites; it returns None when no bucket holds it.
    """

    def __init__(self, model: Transformer, buckets: Sequence[int] | None = None) -> None:
        self.model = model
        self.buckets = sorted(buckets or range(ROWS, MAX_ROWS + 1, ROWS))
        if any(rows % ROWS for rows in self.buckets):
            raise ValueError(f"buckets must be multiples of {ROWS} rows, not {self.buckets}")
        shape, device, dtype = model.config.shape, model.device, model.dtype
        most = self.buckets[-1]
        self.tokens = torch.zeros(most, dtype=torch.long, device=device)
        self.positions = torch.zeros(most, dtype=torch.long, device=device)
        self.qkv = torch.zeros(most, shape.qkv_width, dtype=dtype, device=device)
        self.attended = torch.zeros(most, shape.heads, shape.head_dim, dtype=dtype, device=device)
        self.delta = torch.zeros(most, shape.hidden, dtype=dtype, device=device)
        self.residual = torch.zeros_like(self.delta)
        self._graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        start = time.perf_counter()
        self._capture()
        self.capture_seconds = time.perf_counter() - start

    def run(self, tokens: Tensor, positions: Tensor, attend: AttentionInto) -> tuple[Tensor, Tensor] | None:
        count = len(tokens)
        rows = bucket_rows(count, self.buckets)
        if rows is None:
            return None
        self.tokens[:count].copy_(tokens, non_blocking=True)
        self.positions[:count].copy_(positions, non_blocking=True)
        graphs = self._graphs[rows]
        q, k, v = self.views(count)
        for layer, graph in enumerate(graphs[:-1]):
            graph.replay()
            attend(layer, q, k, v, self.attended[:count])
        graphs[-1].replay()
        return self.delta[:count], self.residual[:count]

    def views(self, count: int) -> tuple[Tensor, Tensor, Tensor]:
        """q (count, heads, d), k and v (count, kv_heads, d): views of the first `count` static `qkv` rows."""
        shape = self.model.config.shape
        return split_heads(self.qkv[:count], shape.heads, shape.kv_heads, shape.head_dim)

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.model.device)
        side.wait_stream(torch.cuda.current_stream(self.model.device))
        pool = torch.cuda.graph_pool_handle()
        with torch.cuda.stream(side):
            for rows in reversed(self.buckets):  # largest first: the smaller ones fit in its pool
                self._body(rows, _Breaker(self, None))  # Triton's first launches compile outside capture
                torch.cuda.synchronize(self.model.device)
                breaker = _Breaker(self, pool)
                breaker.begin()
                delta, residual = self._body(rows, breaker)
                self.delta[:rows].copy_(delta)
                self.residual[:rows].copy_(residual)
                self._graphs[rows] = breaker.end()
        torch.cuda.current_stream(self.model.device).wait_stream(side)
        torch.cuda.synchronize(self.model.device)

    def _body(self, rows: int, breaker: _Breaker) -> tuple[Tensor, Tensor]:
        with torch.inference_mode():
            return self.model.body(self.tokens[:rows], self.positions[:rows], breaker, self.qkv[:rows])


class _Breaker:
    """The `LayerAttention` the body is captured with: checks that q, k and v are the static `qkv` rows
    (rotated in place), ends the current graph, starts the next and hands back the static `attended` rows
    (eagerly, without a pool, it only checks)."""

    def __init__(self, graphs: PiecewiseGraphs, pool: Any) -> None:
        self.graphs, self.pool = graphs, pool
        self.captured: list[torch.cuda.CUDAGraph] = []
        self.current: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        self.current = torch.cuda.CUDAGraph()
        self.current.capture_begin(pool=self.pool)

    def end(self) -> list[torch.cuda.CUDAGraph]:
        assert self.current is not None
        self.current.capture_end()
        self.captured.append(self.current)
        return self.captured

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        rows, graphs = len(q), self.graphs
        static = graphs.views(rows)
        if any(
            a.data_ptr() != b.data_ptr() or a.stride() != b.stride()
            for a, b in zip((q, k, v), static, strict=True)
        ):
            raise RuntimeError("piecewise graphs need q, k and v rotated in place in the static qkv rows")
        if self.pool is not None:
            self.end()
            self.begin()
        return graphs.attended[:rows]
