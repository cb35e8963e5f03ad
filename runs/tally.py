"""How far a long run has got, told to whoever watches: drivers take a `Watcher` and call it with a
`Tally` as work finishes; the command line draws it (or not). Nothing here draws or reads a clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tally:
    """`done` of `total` units (points, requests); `total` is None while unknown, and may be an estimate
    that changes as the run learns more (a search's probes). `note`: a running figure worth showing."""

    done: int
    total: int | None
    note: str = ""


Watcher = Callable[[Tally], None]
