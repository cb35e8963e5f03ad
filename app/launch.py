"""`sangam app`: start the explorer with `streamlit run` on 127.0.0.1.

Imports no Streamlit, so `sangam.cli` can import it at start-up at no cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ENTRY = Path(__file__).with_name("streamlit_app.py")
ROOT = ENTRY.parent.parent  # the directory holding the `app` package
DEFAULT_PORT = 8501


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
    ]


def app_environment() -> dict[str, str]:
    """This environment with the `app` package's directory first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def run_app(args: argparse.Namespace) -> int:
    """Serve the explorer until interrupted; the exit status of streamlit."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {args.port}")
    if importlib.util.find_spec("streamlit") is None:
        raise ValueError("the explorer needs the app extra: pip install -e '.[app]'")
    print(f"sangam app: http://127.0.0.1:{args.port}", flush=True)
    return subprocess.call(streamlit_command(args.port, headless=not args.browser), env=app_environment())
