"""The scheduler's iteration log: one CSV row per worker iteration, columns as the simulator writes them
(`runs.results.ITERATION_COLUMNS`) plus what only a live run measures."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from executor.control.messages import IterationReport
from runs.results import ITERATION_COLUMNS

COLUMNS = (*ITERATION_COLUMNS, "gpu_s", "items", "cycle_s")


def row_of(report: IterationReport, origin: float) -> list[Any]:
    """One report's row, its times counted from `origin`; items read `p|d:query_tokens:context_len`."""
    row: list[Any] = [getattr(report.stats, name) for name in ITERATION_COLUMNS]
    row[ITERATION_COLUMNS.index("start")] = report.stats.start - origin
    row[ITERATION_COLUMNS.index("end")] = report.stats.end - origin
    budget = ITERATION_COLUMNS.index("budget")
    if math.isfinite(row[budget]) and row[budget] == int(row[budget]):
        row[budget] = int(row[budget])  # as the simulator writes it
    items = ";".join(
        f"{'p' if item.prefill else 'd'}:{item.query_tokens}:{item.context_len}" for item in report.items
    )
    return [*row, report.gpu_s, items, report.cycle_s]


class IterationLog:
    """Rows appended as reports arrive, flushed after each batch (before any of its requests is DONE)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(COLUMNS)

    def write(self, reports: Sequence[IterationReport], origin: float) -> None:
        for report in reports:
            self._writer.writerow(row_of(report, origin))
        self._file.flush()

    def close(self) -> None:
        self._file.close()
