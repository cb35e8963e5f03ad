"""Progress bars of the long commands: rich, on stderr, and only when stderr is a terminal, so nothing a
script reads (stdout, files, stderr piped) changes. The drivers tell a `runs.tally.Watcher`; a bar is
one such watcher."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from runs.tally import Tally, Watcher


def wanted(stream: TextIO) -> bool:
    """Bars only on a terminal (not a pipe, a file, or a dumb terminal)."""
    return stream.isatty() and os.environ.get("TERM") != "dumb"


@contextmanager
def bar(what: str, unit: str, stream: TextIO | None = None) -> Iterator[Watcher | None]:
    """A watcher drawing `what`: done/total `unit`, elapsed, ETA and the tally's note, on `stream`
    (stderr) while the block runs, wiped at its end; None (nothing drawn) when `stream` is no terminal."""
    stream = stream if stream is not None else sys.stderr
    if not wanted(stream):
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
    )
    console = Console(file=stream)  # stdout is left alone: it may print while the bar runs (live tables)
    with Progress(*columns, console=console, transient=True, redirect_stdout=False) as progress:
        task = progress.add_task(what, total=None, note="")

        def watch(tally: Tally) -> None:
            progress.update(task, completed=tally.done, total=tally.total, note=tally.note)

        yield watch
