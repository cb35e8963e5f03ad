"""What `sangam live` tells a progress watcher while it replays: requests finished (DONE or ERROR) of the
point's, with those submitted so far and the running mean end-to-end latency of the finished ones.
The scheduler is asked at most once every `every_s`; its results only when more requests are done."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from runs.tally import Tally, Watcher

if TYPE_CHECKING:
    from executor.control.client import SangamClient
    from sangam.request import Request


class LiveTally:
    """Polls the scheduler for `watch`: `poll()` in the replay's loops, `poll(final=True)` at its end."""

    def __init__(self, client: SangamClient, watch: Watcher, total: int, every_s: float = 1.0) -> None:
        self.client = client
        self.watch = watch
        self.total = total
        self.every_s = every_s
        self._next = 0.0
        self._done = -1
        self._mean_s: float | None = None

    def poll(self, final: bool = False) -> None:
        """Tell the watcher where the run is, unless it was told less than `every_s` ago (`final`:
        tell it anyway)."""
        now = time.monotonic()
        if now < self._next and not final:
            return
        self._next = now + self.every_s
        status = self.client.status()
        if status.done != self._done:
            self._done = status.done
            self._mean_s = mean_e2e_s(self.client.results())
        mean = "" if self._mean_s is None else f", mean e2e {self._mean_s:.2f} s"
        self.watch(Tally(status.done + status.errors, self.total, f"{status.submitted} submitted{mean}"))


def mean_e2e_s(finished: list[Request]) -> float | None:
    """The mean, over finished requests, of their last block's end less their arrival (None: none)."""
    ends = [end - r.arrival for r in finished if r.blocks and (end := r.blocks[-1].end) is not None]
    return sum(ends) / len(ends) if ends else None
