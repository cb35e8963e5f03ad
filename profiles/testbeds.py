"""The shipped testbeds (`profiles/data/testbeds/<name>.json`) and what a run takes from one.

`sangam sim --testbed NAME` (also `sangam validate`, `sangam fit`, `sangam reproduce` and the explorer)
models the testbed's GPU with its profiles (each scaled per iteration kind where the testbed says so, plus
its worker loop's costs), KV pages, forwards per block, KV link (and handoff), control-plane delay and
arrival process; a flag given explicitly
overrides the testbed's value. Without `--testbed` a run models `sangam-<gpu>` (`sangam-h100` by
default), whose values are the simulator's documented defaults.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiles.analytic import AnalyticCostModel
from profiles.store import DATA, Profile, load_profile_dir
from profiles.testbed import Testbed, parse_testbed, testbed_dict
from runs.config import RunConfig
from sangam.cost import CostModel, TimeScales, looped, scaled
from sangam.hardware import lookup_gpu, lookup_model, pages_in_kv_dtype

TESTBEDS = DATA / "testbeds"
DEFAULT_GPU = RunConfig().gpu
INSTALLED = DATA.parent.parent  # the directory holding the installed packages
PACKAGES = ("sangam", "runs", "sim", "profiles", "executor", "app", "cli", "calib", "serve")


def known_testbeds(root: Path = TESTBEDS) -> list[str]:
    """Names of the testbeds shipped in `root`."""
    return sorted(p.stem for p in root.glob("*.json"))


def testbed_path(name_or_file: str, root: Path = TESTBEDS) -> Path:
    given = Path(name_or_file)
    return given if given.suffix == ".json" or given.is_file() else root / f"{name_or_file}.json"


def load_testbed(name_or_file: str, root: Path = TESTBEDS) -> Testbed:
    """A shipped testbed by name, or a testbed file; ValueError (one line) if it is missing or bad."""
    path = testbed_path(name_or_file, root)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        if path.parent != root:
            raise ValueError(f"no testbed file {path}") from None
        known = ", ".join(known_testbeds(root)) or "none"
        raise ValueError(f"no testbed {name_or_file!r} (known: {known}, or a JSON file)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the testbed {path}: {err}") from None
    return parse_testbed(data, path.stem)


def inside_package(path: Path, installed: Path = INSTALLED) -> bool:
    """Whether `path` lies inside one of the installed packages (their code or shipped data)."""
    resolved = path.resolve()
    return any(resolved.is_relative_to((installed / package).resolve()) for package in PACKAGES)


def new_testbed_file(
    name: str | None, out: Path | None, base: str, root: Path = TESTBEDS, installed: Path = INSTALLED
) -> tuple[str, Path]:
    """The name and file of a testbed `sangam fit` makes: `out` a `.json` file (named after the testbed,
    whose name defaults to its stem), or a directory (default: the working directory) to hold NAME.json
    (NAME defaulting to `base` + '-fit'). A shipped testbed's name, and a file inside the installed
    package, are refused (ValueError, one line): a command never replaces what ships."""
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"--name {name!r}: a testbed's name is letters, digits, '.', '_' and '-'")
    file = out if out is not None and out.suffix == ".json" else None
    if out is not None and file is None and out.suffix and not out.is_dir():
        raise ValueError(f"--out {out}: give a directory or a testbed file ending in .json")
    name = name or (file.stem if file is not None else f"{base}-fit")
    path = file if file is not None else (out if out is not None else Path()) / f"{name}.json"
    if path.stem != name:
        raise ValueError(f"a testbed's file is named after it: --out {out} for --name {name}")
    if name in known_testbeds(root):
        raise ValueError(f"{name} is a shipped testbed, which no command replaces: give another --name")
    if inside_package(path, installed):
        raise ValueError(f"--out {out}: inside the installed package ({installed}), which no command changes")
    return name, path


def write_testbed(testbed: Testbed, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(testbed_dict(testbed), indent=2) + "\n")


def choose_testbed(name: str | None, gpu: str | None, root: Path = TESTBEDS) -> Testbed:
    """The testbed a run models: `name` (an explicit `--gpu` must be its GPU), else `sangam-<gpu>`."""
    if name is None:
        return load_testbed(f"sangam-{gpu or DEFAULT_GPU}", root)
    testbed = load_testbed(name, root)
    if gpu is not None and gpu != testbed.gpu:
        raise ValueError(f"testbed {testbed.name} models the {testbed.gpu}, not --gpu {gpu}")
    return testbed


def testbed_profile(testbed: Testbed, model: str, data: Path = DATA) -> Profile | None:
    """The iteration-time profile of `model` on the testbed (None: it has no data for the model)."""
    return load_profile_dir(model, testbed.profile_dir(model), testbed.gpu, data)


def testbed_scales(testbed: Testbed, model: str, profile: Profile | None) -> TimeScales:
    """The testbed's time scales of `model`: they scale its profile; the analytic model stays unscaled."""
    return testbed.scales(model) if profile is not None else TimeScales()


def unscaled_cost_model(
    testbed: Testbed, model: str, cost: str = "profile", data: Path = DATA
) -> tuple[CostModel, str, Profile | None]:
    """What prices `model`'s iterations on the testbed before any time scale, its name for summary.json,
    and the profile: the testbed's profile as measured (or derived), or with `cost` 'analytic' the
    analytic model of its GPU; ValueError (one line) where the testbed has no profile of the model.
    `sim.setup.Resolver.priced` scales it."""
    profile = testbed_profile(testbed, model, data) if cost == "profile" else None
    directory = testbed.profile_dir(model)
    # `sangam fit --profile` names a directory outside the package by its absolute path
    shown = directory if Path(directory).is_absolute() else f"profiles/data/{directory}"
    if profile is None and cost == "profile" and (data / directory).is_dir():
        raise ValueError(f"testbed {testbed.name}: no profile of {model} in {shown}")
    if profile is None and cost == "profile":
        raise ValueError(f"testbed {testbed.name}: its profiles ({shown}) are missing")
    if profile is None:
        return AnalyticCostModel(lookup_model(model), lookup_gpu(testbed.gpu)), "analytic", None
    source = f"derived from {profile.derived_from}" if profile.derived_from else "measured"
    if directory not in (profile.gpu, profile.derived_from):  # data of another executor
        source = f"{directory} profile, {source}"
    return profile.cost_model(), source, profile


def scaled_cost_model(cost: CostModel, name: str, scales: TimeScales) -> tuple[CostModel, str]:
    """`cost` times `scales`, and its name saying so (`measured, times 1.2`)."""
    return scaled(cost, scales), name if scales.identity else f"{name}, {scales.label()}"


def looped_cost_model(testbed: Testbed, cost: CostModel, name: str) -> tuple[CostModel, str]:
    """`cost` plus what the testbed's worker loop adds to every iteration, and its name saying so."""
    loop = testbed.loop_costs()
    return looped(cost, loop), name if loop.none else f"{name}, {loop.label()}"


def testbed_config(
    testbed: Testbed, base: RunConfig, profile: Profile | None, given: Mapping[str, Any]
) -> RunConfig:
    """`base` on the testbed: its GPU, its KV pages (else the profile's live worker's; bf16 pages, or the
    profile's FP8 ones where it was measured with an FP8 KV cache, converted to `base.kv_cache_dtype`'s in
    the same memory) and its arrival clip, except where `given` (the flags given explicitly: pages,
    arrival_clip, arrival_cv) says. ValueError (one line) for an FP8 KV cache on a testbed of the
    reference implementation, which has none."""
    if base.kv_cache_dtype != "auto" and profile is not None and profile.peer is not None:
        raise ValueError(
            f"testbed {testbed.name} prices the reference implementation ({profile.peer}), which has no "
            f"{base.kv_cache_dtype} KV cache: --kv-cache-dtype {base.kv_cache_dtype} needs a sangam-* testbed"
        )
    pages = given.get("pages")
    if pages is None:
        pages, stored = testbed.pages(base.model), "auto"
        if pages is None and profile is not None:
            pages, stored = profile.kv_pages, profile.kv_cache_dtype
        if pages is not None:
            pages = pages_in_kv_dtype(pages, base.kv_cache_dtype, stored)
    clip = given.get("arrival_clip")
    if clip is None and given.get("arrival_cv") is None:
        clip = testbed.arrival.clip
    return dataclasses.replace(base, gpu=testbed.gpu, pages=pages, arrival_clip=clip)


def testbed_progress(testbed: Testbed, model: str, trace: str, given: str | None) -> str:
    """The forwards-per-block spec of a run: `given` (`--progress`) or the testbed's."""
    return given if given else testbed.progress_spec(model, trace)
