"""argparse value types shared by the command lines: bad values become one-line usage errors."""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type[int] | type[float], what: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


MAX_INT = 2**31 - 1  # a count, budget or size past this means nothing here and overflows tables' int64s


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if not 0 < value <= MAX_INT:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {MAX_INT}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a positive number")
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int, "an integer >= 0"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a number >= 0")
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    """A TCP port; 0 asks for any free one."""
    value = int(_number(text, int, "a port number"))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in 0-65535, got {text!r}")
    return value
