"""Worker failures to inject: `W@T` specs, parsed without touching any driver."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Failure:
    """Worker `worker` is lost `at` seconds into the run."""

    worker: int
    at: float


def parse_failures(text: str) -> list[Failure]:
    """`W@T[,W@T...]`, for example `1@30,2@45.5`: worker ids and times in seconds."""
    failures = []
    for part in text.split(","):
        spec = part.strip()
        worker, at, rest = (*spec.split("@"), "", "")[:3]
        if not spec or rest or not at:
            raise ValueError(f"bad failure {spec!r}: use W@T, a worker id and a time in seconds (e.g. 1@30)")
        try:
            failure = Failure(int(worker), float(at))
        except ValueError:
            raise ValueError(
                f"bad failure {spec!r}: W@T takes an integer worker id and a number of seconds"
            ) from None
        if failure.worker < 0 or not (math.isfinite(failure.at) and failure.at >= 0):
            raise ValueError(f"bad failure {spec!r}: the worker id and the time must be non-negative")
        failures.append(failure)
    return failures
