"""The results table printed by `sangam sim` and `sangam live`: at most 80 columns, numbers never cut,
and the configuration below it wrapped between its fields to the terminal's width."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def seconds(key: str, digits: int = 2) -> Callable[[dict[str, Any]], str]:
    """A cell of `key` (ms) in seconds; '-' where no request completed (a summary without it)."""
    return lambda s: f"{s[key] / 1000:.{digits}f}" if key in s else "-"


COLUMNS = (  # header (two lines), cell
    ("\nQPS", lambda s: f"{s['config']['qps']:g}"),
    ("\ndone", lambda s: f"{s['completed']}"),
    ("mean\ne2e", seconds("mean_e2el_ms")),
    ("p50\ne2e", seconds("median_e2el_ms")),
    ("p99\ne2e", seconds("p99_e2el_ms")),
    ("mean\nqueue", seconds("mean_queue_ms")),
    ("mean\nprefill", seconds("mean_prefill_ms")),
    ("mean\ndecode", seconds("mean_decode_ms")),
    ("mean\ntransfer", seconds("mean_transfer_ms", 3)),
    ("over-\nflow", lambda s: f"{100 * s['overflow_rate']:.1f}%" if "overflow_rate" in s else "-"),
    ("\nreq/s", lambda s: f"{s['request_throughput']:.2f}" if "request_throughput" in s else "-"),
)


def caption(cfg: dict[str, Any]) -> str:
    devices = cfg.get("devices")  # live runs: what the workers ran on
    cpus = f"{len(devices)} CPU worker{'s' if len(devices) > 1 else ''}" if devices else ""
    where = cfg["gpu"] if not devices or devices[0] != "cpu" else cpus
    model = cfg.get("live_model", cfg["model"])
    return (
        f"{cfg['layout']}  {model} on {where}  trace {PurePath(cfg['trace']).name}  policy {cfg['policy']}  "
        f"tau {cfg['budget']}  theta {cfg['theta']}  {cfg['num_requests']} requests  seed {cfg['seed']}"
    )


def print_sim_table(summaries: Sequence[dict[str, Any]], title: str = "sangam sim") -> None:
    """One row per QPS point, times in seconds; the run's configuration and build on the line below."""
    rows = [[cell(s) for _, cell in COLUMNS] for s in summaries]
    table = Table(title=f"{title} (seconds)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header, _ in COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.width = max(
        console.width, 80
    )  # narrower, a terminal wraps the lines instead of rich cutting cells
    console.print(table)
    build = summaries[0].get("build")
    fields = caption(summaries[0]["config"]).split("  ") + ([f"{build} build"] if build else [])
    for line in wrap_fields(fields, console.width):
        console.print(line, soft_wrap=True)  # rich never breaks a field; one longer than the line stays whole


def wrap_fields(fields: Sequence[str], width: int) -> list[str]:
    """`fields` joined by two spaces into lines of at most `width` characters, breaking only between
    fields (a field longer than `width` gets a line of its own)."""
    lines: list[str] = []
    for field in fields:
        if lines and len(lines[-1]) + 2 + len(field) <= width:
            lines[-1] += "  " + field
        else:
            lines.append(field)
    return lines
