"""The native build: asked for explicitly, used whole, refused once stale, and giving the same results as
the sources (the comparison runs only where a native build is installed: CI builds one)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from runs import build
from runs.build import NATIVE_MODULES, StaleBuild

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sangam", "runs", "sim", "profiles")


def python_tree(tmp_path: Path) -> Path:
    """A copy of the simulator's packages without any native build: there they run as Python."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so", "native.json")
        )
    return tmp_path


def _fake_sources(root: Path) -> None:
    for module in NATIVE_MODULES:
        path = build.source_path(module, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"NAME = {module!r}\n")


def test_a_native_build_goes_stale_when_any_source_changes(tmp_path: Path) -> None:
    _fake_sources(tmp_path)
    assert build.stale(tmp_path) == []  # no native build: nothing to go stale
    hashes = {m: build.source_hash(m, tmp_path) for m in NATIVE_MODULES}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "native.json").write_text(json.dumps(hashes))
    assert build.stale(tmp_path) == []
    (tmp_path / "sim" / "cluster.py").write_text("NAME = 'edited'\n")
    assert build.stale(tmp_path) == ["sim.cluster"]


def test_a_stale_build_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "stale", lambda: ["sangam.kv"])
    with pytest.raises(StaleBuild, match=r"^sangam/kv.py changed since the native build \(SANGAM_NATIVE=1"):
        build.check()
    from cli import main as cli_main

    ran: list[object] = []
    monkeypatch.setattr(cli_main.COMMANDS["sim"], "run", ran.append)
    assert cli_main.main(["sim", "-n", "5"]) == 2 and ran == []  # refused before the command runs
    assert capsys.readouterr().err.count("\n") == 1


def test_the_build_in_use_is_the_one_installed() -> None:
    """An install asked to compile (SANGAM_NATIVE=1, as CI's second install) runs every hot module native;
    without a native build every one runs from its source."""
    native = (ROOT / "runs" / "native.json").exists()
    if os.environ.get("SANGAM_NATIVE", "") not in ("", "0"):
        assert native, "SANGAM_NATIVE is set but no native build is installed"
    files = [importlib.import_module(m).__file__ or "" for m in NATIVE_MODULES]
    assert [f.endswith(".py") for f in files] == [not native] * len(files), files
    assert build.build() == ("native" if native else "python")


def test_the_build_is_native_only_with_every_extension_in_place(tmp_path: Path) -> None:
    _fake_sources(tmp_path)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    extensions = [build.source_path(m, tmp_path).with_suffix(suffix) for m in NATIVE_MODULES]
    for path in extensions:
        path.write_text("")
    assert build.build(tmp_path) == "native"
    extensions[-1].unlink()
    assert build.build(tmp_path) == "python"


POINT = (
    "import json; from runs.config import RunConfig; from sim.options import SimOptions; "
    "from sim.sweep import GridOptions, grid, run_point; "
    "c = RunConfig(num_requests=300, qps=7.5, mode='5P3C'); "
    "p = grid(c, GridOptions(), [7.5], SimOptions(), None)[0]; "
    "print(json.dumps(run_point(p), sort_keys=True))"
)


def _point(cwd: Path) -> dict[str, object]:
    env = os.environ | {"PYTHONPATH": str(cwd)}
    out = subprocess.run([sys.executable, "-c", POINT], cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    result.pop("sim_wall_s")
    return result


def test_native_and_python_give_the_same_point(tmp_path: Path) -> None:
    if build.build() != "native":
        pytest.skip("no native build installed (SANGAM_NATIVE=1 pip install -e . makes one)")
    native, python = _point(ROOT), _point(python_tree(tmp_path))
    assert (native.pop("build"), python.pop("build")) == ("native", "python")
    assert native == python and native["completed"] == 300


def test_clean_removes_the_built_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_sources(tmp_path)
    (tmp_path / "runs").mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    made = [
        build.source_path("sangam.kv", tmp_path).with_suffix(suffix),
        tmp_path / f"sangam_native__mypyc{suffix}",
    ]
    for path in [*made, tmp_path / "runs" / "native.json"]:
        path.write_text("")
    assert sorted(build.built_files(tmp_path)) == sorted([*made, tmp_path / "runs" / "native.json"])
    monkeypatch.setattr(build, "ROOT", tmp_path)
    build.main(["--clean"])
    assert build.built_files(tmp_path) == [] and build.source_path("sangam.kv", tmp_path).exists()


def classes(tp: Any, seen: set[type] | None = None) -> set[type]:
    """Every class a value of type `tp` can hold: its type arguments, and a dataclass's fields, followed
    down."""
    seen = set() if seen is None else seen
    for arg in typing.get_args(tp):
        classes(arg, seen)
    origin = typing.get_origin(tp) or tp
    if isinstance(origin, type) and origin not in seen:
        seen.add(origin)
        if dataclasses.is_dataclass(origin):
            for hint in typing.get_type_hints(origin).values():
                classes(hint, seen)
    return seen


def test_what_worker_processes_are_sent_and_return_holds_no_native_class() -> None:
    """Process pools and Ray pickle a point and its result, and a frozen native class cannot be
    unpickled: a point is plain data (a config, options, names), from which the worker rebuilds what
    runs it (its testbed's `sim.setup.Resolver`), whichever build is installed."""
    from app.sweep import PointResult, PointSpec, point_specs, resolve
    from calib.reproduce import PointOutcome, Task
    from runs.config import RunConfig
    from sim.options import SimOptions
    from sim.sweep import GridOptions, Point, grid

    for sent in (Point, PointSpec, PointResult, Task, PointOutcome):
        native = {cls for cls in classes(sent) if cls.__module__ in NATIVE_MODULES}
        assert not native, (sent, native)
    base = RunConfig(mode="1P1D", num_requests=5)
    for point in (grid(base, GridOptions(), [1.0], SimOptions(), None)[0],
                  point_specs(resolve(base), ["1P1D"], [1.0], [0])[0]):  # fmt: skip
        assert pickle.loads(pickle.dumps(point)) == point  # what process pools and Ray do
