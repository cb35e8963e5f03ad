"""The `--out` directory of a run: one point's results at its top, several points' in `qps-Q/` folders."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

RESULT_FILES = ("requests.csv", "blocks.csv", "summary.json")


def point_dirs(out: Path, rates: Sequence[float]) -> list[Path]:
    """Where each point's results go; results of an earlier run that these would not replace are removed
    (a stale `qps-Q/` folder or top-level file would pass for this run's), and nothing else is touched."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    dirs = [out / f"qps-{q:g}" for q in rates] if len(rates) > 1 else [out]
    if out.is_dir():
        for old in out.glob("qps-*"):
            if old.is_dir() and old not in dirs and _only_results(old):
                shutil.rmtree(old)
        if len(rates) > 1:
            for name in RESULT_FILES:
                (out / name).unlink(missing_ok=True)
    return dirs


def _only_results(folder: Path) -> bool:
    return all(p.name in RESULT_FILES for p in folder.iterdir())
