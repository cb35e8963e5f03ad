"""The results table printed by `sangam sim` and `sangam live`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("QPS", lambda s: f"{s['config']['qps']:g}"),
    ("done", lambda s: f"{s['completed']}"),
    ("mean e2e s", lambda s: f"{s['mean_e2el_ms'] / 1000:.2f}"),
    ("p50 e2e s", lambda s: f"{s['median_e2el_ms'] / 1000:.2f}"),
    ("p99 e2e s", lambda s: f"{s['p99_e2el_ms'] / 1000:.2f}"),
    ("mean queue s", lambda s: f"{s['mean_queue_ms'] / 1000:.2f}"),
    ("mean prefill s", lambda s: f"{s['mean_prefill_ms'] / 1000:.2f}"),
    ("mean decode s", lambda s: f"{s['mean_decode_ms'] / 1000:.2f}"),
    ("mean transfer s", lambda s: f"{s['mean_transfer_ms'] / 1000:.3f}"),
    ("overflow", lambda s: f"{100 * s['overflow_rate']:.1f}%"),
    ("req/s", lambda s: f"{s['request_throughput']:.2f}"),
)


def print_sim_table(summaries: Sequence[dict[str, Any]], title: str = "sangam sim") -> None:
    """One row per QPS point."""
    cfg = summaries[0]["config"]
    devices = cfg.get("devices")  # live runs: what the workers ran on
    where = cfg["gpu"] if not devices or devices[0] != "cpu" else f"{len(devices)} CPU workers"
    model = cfg.get("live_model", cfg["model"])
    caption = (
        f"{cfg['layout']}  {model} on {where}  trace {cfg['trace']}  policy {cfg['policy']}  "
        f"tau {cfg['budget']}  theta {cfg['theta']}  {cfg['num_requests']} requests  seed {cfg['seed']}"
    )
    table = Table(title=title, caption=caption)
    for name, _ in COLUMNS:
        table.add_column(name, justify="right")
    for summary in summaries:
        table.add_row(*(cell(summary) for _, cell in COLUMNS))
    # Rich wraps at 80 columns when output is not a terminal; keep logs and pipes readable.
    Console(width=None if sys.stdout.isatty() else 140).print(table)
