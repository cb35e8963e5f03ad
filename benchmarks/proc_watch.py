"""Sample the CPU time of every thread of the processes a live run starts, and the cgroup's CPU throttling.

    python -m benchmarks.proc_watch --out proc.csv [--every 0.1] [--match executor.worker ...]

Every `--every` seconds, for each process whose command line holds one of the `--match` strings, writes one
row per thread that ran since the last sample: the time (monotonic seconds, as the live run's processes read
it, and wall-clock seconds, as nvidia-smi's), the process's match, its pid, the thread's id and name, and the
CPU milliseconds it used; and one row
`cgroup` with the CPU time the cgroup was throttled (cpu.stat's throttled_usec, cgroup v2) in the same
interval. Runs until killed (SIGTERM or SIGINT), flushing every row: `benchmarks/h200_fp8_watch.sh` puts
it beside a live run, to tell a host that starved the GPU from a GPU that slowed.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import time
from pathlib import Path

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")
CPU_STAT = Path("/sys/fs/cgroup/cpu.stat")


def matching(patterns: list[str]) -> dict[int, str]:
    """pid -> the first pattern its command line holds."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pattern = next((p for p in patterns if p in cmdline), None)
        if pattern is not None:
            found[int(entry.name)] = pattern
    return found


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (name, utime + stime in clock ticks)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (name, int(fields[11]) + int(fields[12]))  # utime, stime
    return out


def throttled_usec() -> int | None:
    try:
        for line in CPU_STAT.read_text().splitlines():
            key, value = line.split()
            if key == "throttled_usec":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--match", action="append", default=[], help="a command-line substring")
    args = parser.parse_args(argv)
    patterns = args.match or ["executor.worker", "executor.control", "cli.main"]
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    last: dict[tuple[int, int], int] = {}
    last_throttled = throttled_usec()
    with args.out.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["t", "wall", "process", "pid", "tid", "thread", "cpu_ms"])
        while not stop:
            time.sleep(args.every)
            now, wall = time.monotonic(), time.time()
            for pid, pattern in matching(patterns).items():
                for tid, (name, ticks) in thread_ticks(pid).items():
                    used = ticks - last.get((pid, tid), ticks)
                    last[(pid, tid)] = ticks
                    if used:
                        cpu_ms = f"{used * TICK_MS:.0f}"
                        out.writerow([f"{now:.3f}", f"{wall:.3f}", pattern, pid, tid, name, cpu_ms])
            throttled = throttled_usec()
            if throttled is not None and last_throttled is not None and throttled > last_throttled:
                throttled_ms = f"{(throttled - last_throttled) / 1e3:.1f}"
                out.writerow([f"{now:.3f}", f"{wall:.3f}", "cgroup", 0, 0, "throttled", throttled_ms])
            last_throttled = throttled
            f.flush()


if __name__ == "__main__":
    main()
