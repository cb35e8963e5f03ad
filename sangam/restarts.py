"""When a lost worker is started again, and when no longer: exponential backoff with a bound.

A worker whose process dies is restarted after `first_s`, and each further death of the same worker
within `stable_s` of its start doubles the wait (`factor`, at most `max_s`). After `limit` restarts in a
row that did not stay up, the worker is given up: a process that dies at start (a broken device, memory
its predecessor still holds) does not loop forever. A process that stayed up `stable_s` starts the count
again. Pure: the driver passes the uptimes in and keeps the count (`Restarts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    limit: int = 5  # restarts in a row that die within stable_s, before the worker is given up
    first_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0
    stable_s: float = 60.0  # a process up this long was healthy: the count starts again

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"the restart limit must be at least 0, got {self.limit}")
        if not (self.first_s >= 0 and self.factor >= 1 and self.max_s >= self.first_s and self.stable_s > 0):
            raise ValueError(f"bad restart backoff: {self}")

    def delay(self, attempt: int) -> float:
        """The wait before restart number `attempt` (0: the first) of a row."""
        return float(min(self.max_s, self.first_s * self.factor**attempt))


@dataclass(slots=True)
class Restarts:
    """One driver's restarts of its workers under `policy`."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    row: dict[int, int] = field(default_factory=dict)  # worker -> restarts in a row that died early

    def on_exit(self, worker: int, uptime: float) -> float | None:
        """`worker`'s process ended after `uptime` seconds: the wait before its restart, or None when it
        is given up (`limit` restarts in a row died within `stable_s`)."""
        row = 0 if uptime >= self.policy.stable_s else self.row.get(worker, 0)
        if row >= self.policy.limit:
            return None
        self.row[worker] = row + 1
        return self.policy.delay(row)

    def gave_up(self, worker: int) -> str:
        """Why `worker` was given up, in words."""
        n = self.row.get(worker, 0)
        return (
            f"gave up restarting it after {n} restart{'s' if n != 1 else ''} in a row, each dead within "
            f"{self.policy.stable_s:g} s of its start"
        )
