"""Host-side timing of a live worker, from outside (issue 30: FP8 mixed iterations that took twice their
price while the worker's main thread stayed busy). On PYTHONPATH, Python imports this in every process a
live run starts; in the worker (`executor.worker.process`) it records, to `$HOSTWATCH_DIR/worker-<pid>.csv`:

- `step`: each `Engine.step` that ran a forward: its start (monotonic seconds, as the iteration log's
  `start` before the run's origin is taken off), the host time to launch the forward (`Engine._timed_forward`
  returning), and the whole step's host time;
- `gc`: each garbage collection: its start, its duration and its generation.

Nothing in the worker is changed but these two wrappers and a `gc.callbacks` entry.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

DIRECTORY = os.environ.get("HOSTWATCH_DIR")


def _install() -> None:
    rows: list[str] = []
    path = os.path.join(DIRECTORY or ".", f"worker-{os.getpid()}.csv")
    out = open(path, "w", buffering=1)  # noqa: SIM115  # lives as long as the process
    out.write("kind,start,a,b\n")
    gc_start = [0.0]

    def flush() -> None:
        if len(rows) >= 64:
            out.write("".join(rows))
            rows.clear()

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[0] = time.monotonic()
        else:
            rows.append(f"gc,{gc_start[0]:.6f},{time.monotonic() - gc_start[0]:.6f},{info['generation']}\n")

    gc.callbacks.append(on_gc)

    def patch() -> None:
        while getattr(sys.modules.get("executor.worker.engine"), "Engine", None) is None:
            time.sleep(0.05)
        engine = sys.modules["executor.worker.engine"].Engine
        timed, step = engine._timed_forward, engine.step
        launched = [0.0]

        def timed_forward(self, items):  # type: ignore[no-untyped-def]
            t0 = time.monotonic()
            result = timed(self, items)
            launched[0] = time.monotonic() - t0
            return result

        def whole_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            launched[0] = -1.0
            t0 = time.monotonic()
            report = step(self, *args, **kwargs)
            if launched[0] >= 0:
                rows.append(f"step,{t0:.6f},{launched[0]:.6f},{time.monotonic() - t0:.6f}\n")
                flush()
            return report

        engine._timed_forward, engine.step = timed_forward, whole_step

    threading.Thread(target=patch, daemon=True).start()
    import atexit

    atexit.register(lambda: out.write("".join(rows)))


if DIRECTORY and "executor.worker.process" in sys.orig_argv:
    _install()
