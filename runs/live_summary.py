"""A run's summary.json read back by the calibration commands: its config, and whether its run timed the
model it names on a GPU (a tiny test twin on CPU workers times neither)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def run_summary(directory: Path) -> dict[str, Any]:
    """The summary.json in `directory`, with its config object; ValueError (one line, naming the file) if
    there is none to read."""
    path = directory / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a run's summary ({err})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
        raise ValueError(f"{path}: no 'config' object: not the summary of a sangam run")
    return summary


def run_config(directory: Path) -> dict[str, Any]:
    """The config the summary.json in `directory` records (`run_summary`)."""
    config: dict[str, Any] = run_summary(directory)["config"]
    return config


def finite_number(value: object) -> bool:
    """Whether a JSON value is a finite number (not a bool; an int past a float's range is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def served_model(config: dict[str, Any]) -> str:
    """The model a live run served (a tiny test twin, or the model itself)."""
    return str(config.get("live_model") or config.get("model"))


def check_measured(config: dict[str, Any], where: str) -> None:
    """ValueError unless the run served the model its config names on GPUs: its times are that model's on
    its GPU, not a CPU worker's."""
    if served_model(config) != str(config.get("model")):
        raise ValueError(
            f"{where}: its run served {served_model(config)}, not {config.get('model')}: it measured nothing "
            "of that model"
        )
    devices = [str(d) for d in config.get("devices") or []]
    if any(d.startswith("cpu") for d in devices):
        raise ValueError(
            f"{where}: its run was on CPU workers ({', '.join(devices)}), not {config.get('gpu')} GPUs"
        )
