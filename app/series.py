"""Per-worker queue length and KV pages over time, derived from blocks (`blocks.csv` rows or the sim's).

A block waits on its prefill worker from `dispatch` to `prefill_start` (what the iteration log calls
`waiting_prefills`). It holds `ceil(seq_len / 16)` KV pages on its prefill worker from `prefill_start` to
`transfer_end` (to `end` when its KV is not moved), and on its decode worker from `transfer_start` to `end`.
Both levels are step functions; a chart gets, per worker, the highest level within each time bin, so
short peaks survive the binning.

The derivation runs on a float table with one row per block and the columns COLUMNS (NaN: did not
happen), built from `blocks.csv`-like rows by `rows_table` or from simulated requests by `record_table`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sangam.hardware import PAGE
from sangam.request import Request

COLUMNS = (
    "seq_len", "dispatch", "prefill_start", "transfer_start", "transfer_end", "end", "prefill_worker",
    "decode_worker",
)  # fmt: skip
BINS = 300  # time bins per chart: enough for a smooth line, small enough to cache every point

Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Intervals:
    """Parallel arrays: on `worker`, `level` (blocks waiting, or pages held) from `start` to `end` (s)."""

    worker: Array
    start: Array
    end: Array
    level: Array


@dataclass(frozen=True, slots=True)
class WorkerSeries:
    """Levels per worker on a common grid: `times[i]` is the start of bin i."""

    times: tuple[float, ...]
    queue: dict[int, tuple[float, ...]]  # worker -> most blocks waiting to prefill in each bin
    kv_pages: dict[int, tuple[float, ...]]  # worker -> most KV pages held in each bin


def _number(value: Any) -> float:
    """A cell of a row: None and '' (a blank CSV cell) become NaN."""
    return math.nan if value is None or value == "" else float(value)


def rows_table(rows: Iterable[Mapping[str, Any]]) -> Array:
    """The block table of rows holding the COLUMNS (blocks.csv rows joined with their request's seq_len)."""
    return np.array([[_number(row.get(c)) for c in COLUMNS] for row in rows], dtype=float).reshape(-1, 8)


def record_table(requests: Sequence[Request]) -> Array:
    """The block table of simulated requests, read straight from their block records."""
    nan = math.nan
    return np.array(
        [
            (
                req.seq_len,
                nan if b.dispatch is None else b.dispatch,
                nan if b.prefill_start is None else b.prefill_start,
                nan if b.transfer_start is None else b.transfer_start,
                nan if b.transfer_end is None else b.transfer_end,
                nan if b.end is None else b.end,
                nan if b.prefill_worker is None else b.prefill_worker,
                nan if b.decode_worker is None else b.decode_worker,
            )
            for req in requests
            for b in req.blocks
        ],
        dtype=float,
    ).reshape(-1, 8)


def block_intervals(table: Array) -> tuple[Intervals, Intervals]:
    """(queue intervals, KV intervals) of the finished blocks of `table`."""
    seq_len, dispatch, start, moved, arrived, end, src, dst = table.T
    done = ~(np.isnan(start) | np.isnan(end) | np.isnan(src))  # unfinished blocks draw nothing
    waited = done & ~np.isnan(dispatch) & (dispatch < start)
    queue = Intervals(src[waited], dispatch[waited], start[waited], np.ones(int(waited.sum())))
    pages = np.ceil(seq_len / PAGE)
    transferred = done & ~(np.isnan(moved) | np.isnan(dst))
    held_until = np.where(transferred & ~np.isnan(arrived), arrived, end)
    kv = Intervals(
        np.concatenate([src[done], dst[transferred]]),
        np.concatenate([start[done], moved[transferred]]),
        np.concatenate([held_until[done], end[transferred]]),
        np.concatenate([pages[done], pages[transferred]]),
    )
    return queue, kv


def binned_max(
    iv: Intervals, workers: int, start: float, stop: float, bins: int = BINS
) -> dict[int, tuple[float, ...]]:
    """Per worker (0..workers-1 and any other id in `iv`), the highest total level of overlapping
    intervals within each of `bins` equal bins from `start` to `stop`."""
    scale = bins / (stop - start) if stop > start else 0.0  # bins per second
    ids = sorted({*range(workers), *(int(w) for w in np.unique(iv.worker))})
    out = {}
    for worker in ids:
        mine = (iv.worker == worker) & (iv.end > iv.start)
        times = np.concatenate([iv.start[mine], iv.end[mine]])
        deltas = np.concatenate([iv.level[mine], -iv.level[mine]])
        order = np.lexsort((deltas, times))  # by time; at equal times, releases before takes
        times, levels = times[order], np.cumsum(deltas[order])  # levels[i] holds until times[i + 1]
        held = levels[:-1] > 0
        lo, hi, level = times[:-1][held], times[1:][held], levels[:-1][held]
        first = np.minimum(((lo - start) * scale).astype(int), bins - 1)
        last = np.maximum(first, np.minimum(np.ceil((hi - start) * scale).astype(int) - 1, bins - 1))
        peaks = np.zeros(bins)
        np.maximum.at(peaks, first, level)
        spans = last - first  # further bins each segment covers, after its first
        ranks = np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans)  # 0.. within a segment
        np.maximum.at(peaks, np.repeat(first + 1, spans) + ranks, np.repeat(level, spans))
        out[worker] = tuple(peaks.tolist())
    return out


def worker_series(table: Array, workers: int, bins: int = BINS) -> WorkerSeries:
    """Queue length and KV pages per worker over the whole run, on `bins` bins from 0 to the last end."""
    queue, kv = block_intervals(table)
    stop = float(kv.end.max()) if len(kv.end) else 0.0
    width = stop / bins if stop > 0 else 1.0
    return WorkerSeries(
        times=tuple(i * width for i in range(bins)),
        queue=binned_max(queue, workers, 0.0, stop, bins),
        kv_pages=binned_max(kv, workers, 0.0, stop, bins),
    )
