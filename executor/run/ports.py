"""Loopback ports for the processes a run starts (stdlib only: the launcher imports it without torch)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago; the process handed it binds it shortly after."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
