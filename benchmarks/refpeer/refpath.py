"""The guard of every script in this folder: they run in the reference implementation's process
(PYTHONPATH=<reference>/src:benchmarks/refpeer/shim), where `sangam` must be the reference's package."""

from __future__ import annotations

import importlib.util


def require_reference() -> None:
    """Exit with a one-line error unless `import sangam` finds the reference's package."""
    try:
        found = all(
            importlib.util.find_spec(name) is not None
            for name in ("sangam.proto.sangam_pb2_grpc", "sangam.engine.base_scheduler")
        )
    except ModuleNotFoundError:  # a parent package (ours, or none) lacks the submodule
        found = False
    if not found:
        raise SystemExit(
            "error: `sangam` here is not the reference implementation: run with "
            "PYTHONPATH=<reference>/src:benchmarks/refpeer/shim (and not from the repository root)"
        )
