"""`sangam profile` on CPU with the two-layer twin of the model: the DRY=1 run of a device script.

    python3 -m benchmarks.dry_profile ARGS...     # the same arguments as `sangam profile ARGS...`

Runs the command's own code (options, grid, timing, files, fit) with two changes made from outside: the
device is the CPU and the model its tiny twin (`tiny-llada` for `llada-8b`), so a device script's
profile step can be tried here before device time is spent on it. Its times are CPU times of a tiny
model: for trying the command, never for pricing.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from calib import profile_runner
from cli.main import main as sangam
from executor.model.live_models import LIVE_MODELS
from executor.worker.engine import build_model

TINY = {m.spec: name for name, m in LIVE_MODELS.items() if m.tiny}  # llada-8b -> tiny-llada


def tiny_model(name: str, *args: Any, **kwargs: Any) -> Any:
    return build_model(TINY[name], *args, **kwargs)


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    profile_runner.profile_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    profile_runner.build_model = tiny_model  # type: ignore[assignment]
    return sangam(["profile", *argv])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
