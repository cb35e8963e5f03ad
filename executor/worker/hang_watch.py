"""A worker's hang watch: tells once if one iteration runs longer than a timeout (the worker then turns
its health NOT_SERVING, and the scheduler's health checks declare it lost)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

CHECK_S = 1.0


def watch_for_hangs(
    started: Callable[[], float | None],
    timeout: float,
    on_hang: Callable[[str], None],
    stopping: threading.Event,
) -> threading.Thread:
    """Call `on_hang` once, from a thread, if the iteration that began at `started()` (None: none runs)
    has run longer than `timeout` seconds; the thread ends with `stopping`."""

    def watch() -> None:
        while not stopping.wait(CHECK_S):
            began = started()
            if began is not None and time.monotonic() - began > timeout:
                on_hang(f"an iteration has run for more than {timeout:g} s")
                return

    thread = threading.Thread(target=watch, name="hang-watch", daemon=True)
    thread.start()
    return thread
