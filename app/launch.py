"""`sangam app`: start the explorer with `streamlit run` on 127.0.0.1.

Streamlit runs in a process group of its own (the simulator's worker processes join it), so SIGTERM or
SIGINT to `sangam app` stops the whole group and leaves nothing behind. Imports no Streamlit, so
the command line can import it at start-up at no cost.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

ENTRY = Path(__file__).with_name("streamlit_app.py")
ROOT = ENTRY.parent.parent  # the directory holding the `app` package
DEFAULT_PORT = 8501
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# an upload, at most (Streamlit's default is 200): 50,000 trace rows (what the page reads of a trace) of
# the longest steps columns fit in ~40 MB
MAX_UPLOAD_MB = 64
GRACE_S = 10.0  # after SIGTERM, how long the server's group has to exit before it is killed


def add_app_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port on 127.0.0.1 (default 8501)")
    parser.add_argument("--browser", action="store_true", help="open a browser tab once the server is up")


def streamlit_command(port: int, *, headless: bool = True) -> list[str]:
    """The `streamlit run` command line that serves the explorer on 127.0.0.1:`port`."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ENTRY),
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--server.headless",
        "true" if headless else "false",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",  # a tool, not a development server: no reruns on edits
        "--server.maxUploadSize",
        str(MAX_UPLOAD_MB),
    ]


def app_environment() -> dict[str, str]:
    """This environment with the `app` package's directory first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_app(args: argparse.Namespace) -> int:
    """Serve the explorer until it exits or this process gets SIGTERM or SIGINT (then 128 + the signal)."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {args.port}")
    if importlib.util.find_spec("streamlit") is None:
        raise ValueError("the explorer needs the app extra: pip install -e '.[app]'")
    check_port(args.port)
    print(f"sangam app: http://127.0.0.1:{args.port}", flush=True)
    return serve(streamlit_command(args.port, headless=not args.browser), app_environment())


def check_port(port: int) -> None:
    """ValueError if 127.0.0.1:`port` cannot be listened on, e.g. another process holds it (Streamlit would
    print its own lines and exit)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            taken = "is taken; choose another" if err.errno == errno.EADDRINUSE else "cannot be listened on"
            raise ValueError(f"--port {port}: 127.0.0.1:{port} {taken} ({err.strerror})") from None


def serve(command: Sequence[str], env: dict[str, str] | None = None, grace_s: float = GRACE_S) -> int:
    """Run `command` as the leader of a new process group until it exits, or until SIGTERM or SIGINT
    reaches this process (then 128 + the signal); either way no member of the group outlives this call."""
    signals: list[int] = []  # the handler only records them; a second one cuts the grace short

    def record(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in STOP_SIGNALS}
    try:
        server = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            while not signals and server.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=0.1)  # a signal does not interrupt a plain wait()
        finally:
            stop_group(server, grace_s, hurry=lambda: len(signals) > 1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + signals[0] if signals else server.returncode


def stop_group(
    leader: subprocess.Popen[bytes], grace_s: float, hurry: Callable[[], bool] | None = None
) -> None:
    """SIGTERM the process group that `leader` leads, SIGKILL whatever is left after `grace_s` seconds
    (or once `hurry()` is true), and reap the leader."""
    pgid = leader.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not (hurry and hurry()):
        leader.poll()  # reap the leader: a zombie still counts as a member of its group
        if not group_members(pgid):
            break
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    leader.wait()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`, read from /proc; without /proc, [pgid]
    while the group has any member at all."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # it exited while we looked
                # after the command, which may hold spaces and parentheses: state ppid pgrp ...
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if fields[0] != "Z" and int(fields[2]) == pgid:
                    members.append(int(entry.name))
    return members


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already empty
        os.killpg(pgid, signum)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m app.launch [--port N] [--browser]`: `sangam app` without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="python -m app.launch", description="serve the explorer")
    add_app_arguments(parser)
    return run_app(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
