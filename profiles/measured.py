"""The iteration-time model fitted to measurements of our own worker.

    seconds = overhead + graph * graph_saving + (per_item + graph * per_graph_item) * items
              + per_mixed_decode * mixed_decodes  # a decode riding along a prefill (eager attention)
              + per_mixed * mixed                 # a microbatch of both: the decodes' own attention calls
              + per_token * max(tokens, knee)    # linear layers: compute, or the weight-read floor
              + per_square * sum(S^2)             # non-causal prefill attention
              + per_context * sum(C)              # decode attention reading the cached K and V

A decode-only microbatch replayed as a CUDA graph is priced instead by its bucket's own line where the
profile measured that bucket (`GraphTimes`): `fixed + per_longest * max(C)`.

`tokens` counts every query token (S per prefill, 32 per decode, graph padding included).
The weight-read floor (`per_token * knee`) and the KV reads are bandwidth-bound; the rest is
compute or host time. A derived profile for another GPU scales only the bandwidth-bound terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from profiles.shapes import Shape
from sangam.batcher import Microbatch
from sangam.hardware import BLOCK

TERMS = (
    "overhead", "graph", "per_item", "per_graph_item", "per_mixed_decode", "per_mixed",
    "per_token", "per_square", "per_context",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Coefficients:
    overhead: float
    graph: float  # added to CUDA-graph (decode-only) iterations; negative: what a graph saves
    per_item: float  # host work, LM head and sampling of one request
    per_graph_item: float  # what a CUDA-graph replay changes of that (negative: saves)
    per_mixed_decode: float  # what a decode adds beyond that in a microbatch with a prefill
    # what a microbatch with both prefills and decodes costs beyond its parts: each layer attends its decodes
    # in calls of their own (on an H200, LLaDA-8B FP8: a 1,024-token prefill 15.1 ms, with one decode 19.4)
    per_mixed: float
    per_token: float
    per_square: float
    per_context: float
    knee: float  # tokens below which the weight reads, not the matmuls, set the linear time

    def derived(self, bandwidth_ratio: float) -> Coefficients:
        """The same model on a GPU with `bandwidth_ratio` times less memory bandwidth."""
        return replace(self, knee=self.knee * bandwidth_ratio, per_context=self.per_context * bandwidth_ratio)


@dataclass(frozen=True, slots=True)
class Features:
    graph: float
    items: float
    mixed_decodes: float
    mixed: float
    tokens: float
    squares: float
    context: float

    @staticmethod
    def of(shape: Shape, buckets: Sequence[int]) -> Features:
        """`buckets`: the decode batch sizes the worker replays as CUDA graphs (empty: none)."""
        bucket = shape.graph_bucket(buckets)
        queries = BLOCK * (bucket or len(shape.decodes))
        return Features(
            graph=1.0 if bucket else 0.0,
            items=float(len(shape.prefills) + len(shape.decodes)),
            mixed_decodes=float(len(shape.decodes) if shape.prefills else 0),
            mixed=1.0 if shape.prefills and shape.decodes else 0.0,
            tokens=float(sum(shape.prefills) + queries),
            squares=float(sum(s * s for s in shape.prefills)),
            context=float(sum(shape.decodes)),
        )

    def row(self, knee: float) -> tuple[float, ...]:
        """The regressors, in TERMS order, for a given knee."""
        linear = max(self.tokens, knee)
        graph_items = self.graph * self.items
        return (
            1.0, self.graph, self.items, graph_items, self.mixed_decodes, self.mixed, linear, self.squares,
            self.context,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class GraphTimes:
    """Per CUDA-graph bucket, what a decode-only replay costs: `fixed[i] + per_longest[i] * the longest
    context` for bucket `buckets[i]`, fitted on that bucket's measured replays.

    A replay runs the bucket's padded batch whatever the item count, and its attention gives every item
    its own CTAs over that item's whole KV, nearly all in one wave: the longest context, not the sum of
    the contexts, sets its time (on an H200, 6 items cost what 8 do; a replay of 5 items with unequal
    contexts runs as long as 8 items of the longest). Grids of several waves (the largest buckets) and
    split-KV grids depend on the sum as well, so there an unequal batch is priced somewhat high.
    """

    buckets: tuple[int, ...]
    fixed: tuple[float, ...]
    per_longest: tuple[float, ...]

    def line(self, bucket: int) -> tuple[float, float] | None:
        """(fixed, per_longest) of `bucket`, None where it was not measured."""
        if bucket not in self.buckets:
            return None
        i = self.buckets.index(bucket)
        return self.fixed[i], self.per_longest[i]


def predict(c: Coefficients, f: Features) -> float:
    """The shared model's time (no bucket's own line: `shape_seconds` applies those)."""
    return (
        c.overhead
        + c.graph * f.graph
        + c.per_item * f.items
        + c.per_graph_item * f.graph * f.items
        + c.per_mixed_decode * f.mixed_decodes
        + c.per_mixed * f.mixed
        + c.per_token * max(f.tokens, c.knee)
        + c.per_square * f.squares
        + c.per_context * f.context
    )


def shape_seconds(c: Coefficients, graphs: GraphTimes | None, shape: Shape, buckets: Sequence[int]) -> float:
    """What `MeasuredCostModel` charges for an iteration of `shape`."""
    line = graphs.line(shape.graph_bucket(buckets)) if graphs is not None else None
    if line is not None:
        return line[0] + line[1] * max(shape.decodes)
    return predict(c, Features.of(shape, buckets))


class MeasuredCostModel:
    """`CostModel` from fitted coefficients; `buckets`: decode batch sizes replayed as CUDA graphs,
    `graphs`: the measured buckets' own lines."""

    def __init__(
        self, coefficients: Coefficients, buckets: Sequence[int] = (), graphs: GraphTimes | None = None
    ) -> None:
        self.coefficients = coefficients
        self.buckets = tuple(sorted(buckets))
        c = coefficients
        # a decode-only microbatch of n decodes, n = 0..largest bucket, costs `fixed + per_context * context
        # + per_longest * longest + graph`: (fixed, per_context, per_longest, graph) by n (n > 0 replays the
        # smallest bucket holding n as a CUDA graph), from the bucket's own line where it has one
        largest = self.buckets[-1] if self.buckets else 0
        self._decode_only = [(c.overhead, 0.0, 0.0, 0.0)]
        for n in range(1, largest + 1):
            bucket = next(b for b in self.buckets if b >= n)
            line = graphs.line(bucket) if graphs is not None else None
            if line is not None:
                self._decode_only.append((line[0], 0.0, line[1], 0.0))
                continue
            fixed = c.overhead + c.per_item * n + c.per_token * max(BLOCK * bucket, c.knee)
            self._decode_only.append((fixed, c.per_context, 0.0, c.graph + c.per_graph_item * n))

    def seconds(self, mb: Microbatch) -> float:
        """`shape_seconds` of `Shape.of(mb)`, inlined: the simulator calls it every iteration."""
        c = self.coefficients
        prefills, n_decodes = mb.prefills, len(mb.decodes)
        context = longest = 0
        for req in mb.decodes:
            context += req.seq_len
            if req.seq_len > longest:
                longest = req.seq_len
        if not prefills and n_decodes < len(self._decode_only):
            fixed, per_context, per_longest, graph = self._decode_only[n_decodes]
            return fixed + per_context * context + per_longest * longest + graph
        tokens = BLOCK * n_decodes  # run eagerly: every query token, no padding
        squares = 0
        for req in prefills:
            tokens += req.seq_len
            squares += req.seq_len * req.seq_len
        linear = c.knee if c.knee > tokens else tokens  # max(tokens, knee) without a builtin's call
        seconds = c.overhead + c.per_item * (n_decodes + len(prefills)) + c.per_token * linear
        if prefills and n_decodes:
            seconds += c.per_mixed_decode * n_decodes + c.per_mixed
        return seconds + (c.per_square * squares + c.per_context * context)
