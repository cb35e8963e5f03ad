"""Measured KV link profiles for the simulator's link model.

A profile is `profiles/data/links/<name>.json`, written by `python -m calib.link_fit measure` from
timings of the live transfer path (pack, send, receive, unpack) at several sizes, fitted as
seconds = latency_s + bytes / (gb_per_s * 1e9). `load_link` turns one into the `LinkSpec` that
`sim.cluster` charges every KV transfer with; without a profile the simulator keeps its assumed link.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.cluster import LinkSpec

LINKS_DIR = Path(__file__).resolve().parent.parent / "profiles" / "data" / "links"


def known_links(root: Path = LINKS_DIR) -> list[str]:
    """Names of the link profiles shipped in `root`."""
    return sorted(p.stem for p in root.glob("*.json"))


def link_path(name_or_file: str, root: Path = LINKS_DIR) -> Path:
    """A profile's file: `name_or_file` itself if it is a file, else `root/<name>.json`."""
    given = Path(name_or_file)
    if given.suffix == ".json" or given.is_file():
        return given
    return root / f"{name_or_file}.json"


def load_link(name_or_file: str, root: Path = LINKS_DIR) -> LinkSpec:
    """The link model of a measured profile (a name under `root`, or a JSON file)."""
    path = link_path(name_or_file, root)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = ", ".join(known_links(root)) or "none"
        raise ValueError(f"no link profile {name_or_file!r} (known: {known})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read the link profile {path}: {err}") from None
    numbers = []
    for key in ("gb_per_s", "latency_s"):
        value = raw.get(key) if isinstance(raw, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float) or abs(value) > 1e300:
            raise ValueError(f"{path}: a link profile needs a number {key}, got {value!r}")  # true was 1
        numbers.append(float(value))
    try:
        return LinkSpec(*numbers)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
