"""`sangam profile`: measure our worker's iteration times on this GPU (or refit from live logs) and fit."""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.run.live_options import LiveOptions
from runs.args import positive_int
from runs.config import RunConfig
from runs.options import add_options, collect, nonempty_path, option


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    weights: str = option("random", "'random' or a local Hugging Face checkpoint directory")
    cuda_graphs: bool = option(
        True, "time decode-only iterations (and FP8 models' other bodies, in pieces) from CUDA graphs"
    )
    repeats: int = option(5, "timed repeats per iteration shape", parse=positive_int)
    from_log: tuple[Path, ...] = option(
        (), "refit from live iteration logs (sangam live --iteration-log) instead of measuring, into the "
        "profile of --quantization and --kv-cache-dtype; a log of a run with others is refused",
        parse=nonempty_path, many=True, metavar="LOG",
    )  # fmt: skip
    out: Path = option(
        Path("results/profiles"), "profile data root; profiles/data in a source checkout updates the shipped "
        "profiles", parse=nonempty_path, metavar="DIR",
    )  # fmt: skip


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(name, help="measure iteration times of our worker on this GPU and fit them")
    add_options(parser, RunConfig, only=("model", "gpu", "kv_cache_dtype"), defaults={"gpu": "h200"})
    add_options(parser, ProfileOptions)
    add_options(parser, LiveOptions, only=("quantization",))


def run(args: argparse.Namespace) -> int:
    from profiles.store import DATA, load_profile, load_profile_dir, merge_log, paths, profile_directory

    model, gpu, kv_cache_dtype = args.model, args.gpu, args.kv_cache_dtype
    options = collect(ProfileOptions, args)
    quantization = collect(LiveOptions, args).quantization
    root = options.out
    directory = profile_directory(gpu, quantization, kv_cache_dtype)
    if options.from_log:
        data = root / directory
        folders = [folder for folder in (data, *data.parents) if not folder.exists()]
        copies = copy_shipped(model, directory, root)
        try:
            merged = merge_log(model, gpu, list(options.from_log), root, quantization, kv_cache_dtype)
        except Exception:
            for copy in copies:  # a refused log leaves nothing behind: the copies, the folders made for them
                copy.unlink()
            for folder in folders:  # deepest first
                if folder.exists():
                    folder.rmdir()
            raise
        if copies:
            print(f"started from the shipped profile's data in {DATA / directory}")
        print(f"merged {merged} iterations into {paths(model, directory, root)[0]}")
    else:
        from calib.profile_runner import run_profile as measure
        from cli.bars import bar

        with bar("profile", "shapes") as watch:
            data, _ = measure(
                model, gpu, root, weights=options.weights, graphs=options.cuda_graphs,
                repeats=options.repeats, watch=watch, quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
            )  # fmt: skip
        print(f"wrote {data}")
    if directory != gpu:  # its own directory (h200-fp8-kvfp8), fitted as a profile of the GPU it ran on
        profile = load_profile_dir(model, directory, gpu, root)
    else:
        profile = load_profile(model, gpu, root)
    assert profile is not None
    r = profile.report
    print(
        f"{model} on {gpu}: {r['points']} iterations, model {r['candidate']!r}; held out "
        f"({r['folds']}-fold): MAPE {r['heldout_mape']:.2f}%, P90 {r['heldout_p90']:.2f}%, "
        f"max {r['heldout_max']:.2f}%"
    )
    print(
        f"use it: sangam fit --profile {root / directory} --testbed sangam-{gpu} --name NAME --out DIR, "
        f"then --testbed DIR/NAME.json"
    )
    return 0


def copy_shipped(model: str, directory: str, root: Path) -> list[Path]:
    """Copy the shipped profile of `model` in `directory` (its data and metadata) into `root` when `root`
    has none, so `--from-log` merges into a copy and never into the package; the copies made."""
    from profiles.store import DATA, paths

    ours, shipped = paths(model, directory, root)[:2], paths(model, directory, DATA)[:2]
    if any(path.exists() for path in ours) or not all(path.exists() for path in shipped):
        return []
    ours[0].parent.mkdir(parents=True, exist_ok=True)
    for source, copy in zip(shipped, ours, strict=True):
        shutil.copyfile(source, copy)
    return list(ours)
