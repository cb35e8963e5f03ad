"""Helpers for the live tests: option parsing, small traces, and the processes a test left behind."""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

from cli.live import add_live_arguments

REPO_ROOT = Path(__file__).resolve().parent.parent


def live_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_live_arguments(parser)
    return parser.parse_args(list(argv))


def replay(argv: Sequence[str]) -> float:
    """`sangam live` with `argv` to a successful end; its wall seconds. Fails if a process outlived it."""
    from cli.live import run as run_live

    before = child_pids(os.getpid())
    started = time.monotonic()
    assert run_live(live_args(argv)) == 0
    wall = time.monotonic() - started
    assert child_pids(os.getpid()) <= before, "a scheduler or worker process outlived the run"
    return wall


def write_trace(
    path: Path, n: int, *, qps: float, prompt: tuple[int, int], output: tuple[int, int], seed: int
) -> Path:
    """A CSV trace (arrival_time, prompt_len, output_len) of `n` short requests."""
    rng = random.Random(seed)
    now, lines = 0.0, ["arrival_time,prompt_len,output_len"]
    for _ in range(n):
        now += rng.expovariate(qps)
        lines.append(f"{now:.6f},{rng.randint(*prompt)},{rng.randint(*output)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def child_pids(parent: int) -> set[int]:
    """Live (non-zombie) processes whose parent is `parent`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces, so split after the last ')'
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z":
            found.add(int(entry.name))
    return found


def descendants(root: int) -> set[int]:
    out, frontier = set(), [root]
    while frontier:
        children = child_pids(frontier.pop())
        out |= children
        frontier.extend(children)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """The pids still alive after waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of each TCP socket of process `pid`."""
    inodes = _socket_inodes(pid)
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
                out.append((local, remote, fields[3]))
    return out


def listening_ports(pid: int) -> set[int]:
    """TCP ports process `pid` listens on."""
    return {local for local, _, state in _tcp_sockets(pid) if state == "0A"}


def connected_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections of process `pid`."""
    return {remote for _, remote, state in _tcp_sockets(pid) if state == "01"}
