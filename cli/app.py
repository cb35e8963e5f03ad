"""`sangam app`: the what-if explorer (Streamlit) on 127.0.0.1."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any, name: str) -> None:
    from app.launch import add_app_arguments

    add_app_arguments(commands.add_parser(name, help="open the what-if explorer (Streamlit) on 127.0.0.1"))


def run(args: argparse.Namespace) -> int:
    from app.launch import run_app

    return run_app(args)
