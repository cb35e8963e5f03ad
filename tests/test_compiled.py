"""The mypyc-compiled hot modules: the guard that runs them from source once their sources change,
and the same results compiled or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from shutil import which

import pytest

from sangam import compiled

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tree holding every compiled module's source, with no manifest yet."""
    for module in compiled.MODULES:
        path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"NAME = {module!r}\n")
    monkeypatch.setattr(compiled, "ROOT", str(tmp_path))
    monkeypatch.delenv("SANGAM_PURE_PYTHON", raising=False)
    compiled.status.cache_clear()
    yield tmp_path
    compiled.status.cache_clear()


def _write_manifest(root: Path) -> None:
    hashes = {module: compiled.source_hash(module) for module in compiled.MODULES}
    (root / "sangam" / compiled.MANIFEST).write_text(json.dumps(hashes))


def test_the_modules_count_as_compiled_only_while_every_source_matches_its_hash(fake_root: Path) -> None:
    assert compiled.status() == "pure Python: not compiled at install"
    _write_manifest(fake_root)
    compiled.status.cache_clear()
    assert compiled.status() == "compiled"
    (fake_root / "sim" / "cluster.py").write_text("NAME = 'edited'\n")
    compiled.status.cache_clear()
    assert compiled.status() == (
        f"pure Python: {fake_root / 'sim' / 'cluster.py'} changed since install "
        "(pip install -e . compiles it again)"
    )


def test_the_environment_can_ask_for_pure_python(fake_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_manifest(fake_root)
    monkeypatch.setenv("SANGAM_PURE_PYTHON", "1")
    assert compiled.status() == "pure Python: SANGAM_PURE_PYTHON is set"


def test_the_finder_gives_the_sources_of_the_compiled_modules_only(fake_root: Path) -> None:
    finder = compiled._FromSource()
    spec = finder.find_spec("sim.cluster", None)
    assert spec is not None and spec.origin == str(fake_root / "sim" / "cluster.py")
    assert finder.find_spec("sim.sweep", None) is None


def _run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "SANGAM_PURE_PYTHON"} | env
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


FILES = "import sim.cluster, sangam.batcher, profiles.measured as m; print(sim.cluster.__file__, m.__file__)"
POINT = (
    "import json; from sangam.config import RunConfig; from sim.options import SimOptions; "
    "from sim.sweep import GridOptions, grid, run_point; "
    "c = RunConfig(num_requests=300, qps=7.5, mode='5P3C'); "
    "p = grid(c, GridOptions(), [7.5], SimOptions(), None)[0]; "
    "print(json.dumps(run_point(p), sort_keys=True))"
)


def test_pure_python_is_imported_from_source_and_gives_the_same_results_as_this_process() -> None:
    assert all(path.endswith(".py") for path in _run(FILES, SANGAM_PURE_PYTHON="1").split())
    pure = json.loads(_run(POINT, SANGAM_PURE_PYTHON="1"))
    here = json.loads(_run(POINT))
    for result in (pure, here):
        result.pop("sim_wall_s")
    assert pure == here and pure["completed"] == 300


def test_an_install_with_a_c_compiler_compiled_the_modules() -> None:
    """(A build that fell back to Python would pass every other test, at half the speed.)"""
    if which(sysconfig.get_config_var("CC").split()[0]) is None:
        pytest.skip("no C compiler: the install runs these modules as Python")
    status = compiled.status()
    if "changed since install" in status:
        pytest.skip(status)  # a working tree being edited
    assert status == "compiled"
    assert all(path.endswith(".so") for path in _run(FILES).split())


def test_frozen_dataclasses_of_the_compiled_modules_stay_python_classes() -> None:
    """Process pools and Ray pickle them, and a frozen native class cannot be unpickled; a Python
    class with slots keeps its fields in member descriptors, a native one in getset descriptors."""
    import dataclasses
    import importlib
    import inspect
    import types

    frozen = [
        cls
        for module in compiled.MODULES
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass)
        if cls.__module__ == module and dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    ]
    assert len(frozen) >= 10
    for cls in frozen:
        for field in dataclasses.fields(cls):
            assert isinstance(cls.__dict__[field.name], types.MemberDescriptorType), (cls, field.name)
