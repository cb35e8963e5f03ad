"""The simulator's hot modules, compiled with mypyc at install time (`setup.py`), and a guard.

An install compiles `MODULES` into extension modules beside their sources and records each
source's hash in `compiled.json`. Python would import an extension in preference to its source
even after the source was edited, so `guard`, run by each package holding such a module before
any of them is imported, imports every one of them from source instead when a source no longer
matches its hash (all or none: compiled modules call each other's native code directly), or when
`SANGAM_PURE_PYTHON` is set. Results are the same either way; only the speed differs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from types import ModuleType

MODULES = (
    "sangam.batcher",
    "sangam.kv",
    "sangam.progress",
    "sangam.request",
    "sangam.results",
    "sangam.router",
    "sangam.workload",
    "sim.cluster",
    "profiles.measured",
)
MANIFEST = "compiled.json"  # in this package: module name -> sha256 of its source when compiled
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the directory above the packages


def source_path(module: str) -> str:
    return os.path.join(ROOT, *module.split(".")) + ".py"


def source_hash(module: str) -> str:
    with open(source_path(module), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@functools.cache
def status() -> str:
    """`compiled`, or why these modules run from source (`pure Python: ...`); read once a process."""
    if os.environ.get("SANGAM_PURE_PYTHON"):
        return "pure Python: SANGAM_PURE_PYTHON is set"
    try:
        with open(os.path.join(ROOT, "sangam", MANIFEST)) as f:
            hashes = json.load(f)
    except FileNotFoundError:
        return "pure Python: not compiled at install"
    changed = [m for m in MODULES if hashes.get(m) != source_hash(m)]
    if changed:
        again = "pip install -e . compiles it again"
        return f"pure Python: {source_path(changed[0])} changed since install ({again})"
    return "compiled"


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds `MODULES` as their `.py` sources, ahead of the extension modules beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def guard() -> None:
    """Import `MODULES` from source unless the compiled ones match their sources."""
    if status() != "compiled" and not any(isinstance(f, _FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, _FromSource())
