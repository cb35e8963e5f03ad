"""What a replay has learnt from the scheduler so far: every finished request and the last status.

The records are fetched as the run goes (only the new ones, at most once per `interval_s`), so that a run
that ends abnormally (a lost scheduler, a failed cluster, SIGTERM or Ctrl-C) still writes every request
that finished before; nothing finished is thrown away.

Imports only the standard library at import time; the client's types load lazily.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executor.control.client import SangamClient
    from executor.control.messages import ClusterStatus
    from sangam.request import Request

POLL_INTERVAL_S = 1.0


class Collector:
    """Finished requests' records and the last status of one run, fetched from `client`."""

    def __init__(
        self,
        client: SangamClient,
        interval_s: float = POLL_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.clock = clock
        self.records: list[Request] = []  # times in the scheduler's clock
        self.status: ClusterStatus | None = None
        self._last = -float("inf")

    def poll(self) -> None:
        """Fetch the status, and the records of requests finished since the last fetch, if the last
        fetch is `interval_s` old; a failed call raises `SangamError` (what was fetched stays)."""
        if self.clock() - self._last < self.interval_s:
            return
        self.fetch()

    def fetch(self) -> None:
        """Fetch now (the status first: every request it counts as done has its record)."""
        self._last = self.clock()
        status = self.client.status()
        if status.done > len(self.records):
            self.records.extend(self.client.results(first=len(self.records)))
        self.status = status

    @property
    def origin(self) -> float:
        """The scheduler's first accepted arrival: the run's time origin (0 before any status)."""
        return self.status.first_arrival if self.status is not None else 0.0
