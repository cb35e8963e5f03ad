"""Which build of the simulator's hot modules a run uses: `native` (compiled with mypyc at install,
asked for with `SANGAM_NATIVE=1`, see setup.py) or `python` (their sources).

The check runs when a command starts, never at import: a native build whose sources changed since it
was built would run the old code, so `check` refuses it in one line that says how to rebuild."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import sys
from pathlib import Path

NATIVE_MODULES = (  # every simulated iteration runs through these
    "sangam.batcher",
    "sangam.kv",
    "sangam.request",
    "sangam.router",
    "sim.cluster",
    "profiles.measured",
)
ROOT = Path(__file__).resolve().parent.parent  # the directory holding the packages
MANIFEST = ROOT / "runs" / "native.json"  # module -> sha256 of the source it was compiled from
REBUILD = "SANGAM_NATIVE=1 pip install -e . builds it again, python -m runs.build --clean removes it"


def shown(path: Path) -> Path:
    """`path` relative to the repository when inside it (what a shipped file may name), else as it is."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(module: str, root: Path = ROOT) -> str:
    return hashlib.sha256(source_path(module, root).read_bytes()).hexdigest()


def build(root: Path = ROOT) -> str:
    """`native` when every hot module has a compiled extension beside its source (Python imports it
    ahead of the source), else `python`. Nothing is imported: a server need not load the simulator."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    built = [any(source_path(m, root).with_suffix(s).exists() for s in suffixes) for m in NATIVE_MODULES]
    return "native" if all(built) else "python"


def stale(root: Path = ROOT) -> list[str]:
    """The hot modules whose sources changed since the native build (none without a native build)."""
    manifest = root / "runs" / "native.json"
    if not manifest.exists():
        return []
    hashes = json.loads(manifest.read_text())
    return [m for m in NATIVE_MODULES if hashes.get(m) != source_hash(m, root)]


class StaleBuild(RuntimeError):
    """The native build is older than a source it was compiled from."""


def check() -> None:
    """StaleBuild (one line) when the native build is older than its sources."""
    changed = stale()
    if changed:
        source = source_path(changed[0]).relative_to(ROOT)
        raise StaleBuild(f"{source} changed since the native build ({REBUILD})")


def built_files(root: Path = ROOT) -> list[Path]:
    """The native build's files: an extension beside each hot module's source, their shared library
    (`sangam_native__mypyc`) and the manifest."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    names = [source_path(m, root).with_suffix(s) for m in NATIVE_MODULES for s in suffixes]
    names += [root / f"sangam_native__mypyc{s}" for s in suffixes] + [root / "runs" / "native.json"]
    return [p for p in names if p.exists()]


def main(argv: list[str] | None = None) -> None:
    """`python -m runs.build` says which build runs; `--clean` removes a native one."""
    if (sys.argv[1:] if argv is None else argv) == ["--clean"]:
        for path in built_files(ROOT):
            path.unlink()
            print(f"removed {path.relative_to(ROOT)}")
        return
    try:
        check()
    except StaleBuild as err:
        raise SystemExit(f"error: {err}") from None
    print(build())


if __name__ == "__main__":
    main()
