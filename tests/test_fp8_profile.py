"""An FP8 profile (`sangam profile --quantization fp8 --kv-cache-dtype fp8`) on CPU, compared with the
reference's peer grid, made into a testbed by `sangam fit --profile`, and simulated: its FP8 pages are
not doubled again, and the reference's testbeds refuse an FP8 KV cache."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import peer_profile
from calib import profile_runner
from cli.main import main
from executor.worker.engine import build_model
from profiles.shapes import Shape
from profiles.store import DATA, merge_log, profile_directory, read_samples
from sangam.hardware import kv_pages, lookup_gpu, lookup_model

REFERENCE = Path(__file__).parent.parent / "benchmarks" / "results" / "peer-h200"
NINTH_ROUND = Path(__file__).parent.parent / "benchmarks" / "results" / "live-colocated-fp8-llada-8b-h200-10"
LOOP = "plus a loop of 0.0756 ms + 0.028 ms per item up to 4 + 0 ns per token per iteration"
LLADA_BF16_PAGES = kv_pages(lookup_model("llada-8b"), lookup_gpu("h200"))
LLADA_FP8_PAGES = kv_pages(lookup_model("llada-8b"), lookup_gpu("h200"), kv_dtype="fp8")


def test_each_kind_of_profile_has_its_own_directory() -> None:
    assert profile_directory("h200", None) == "h200"
    assert profile_directory("h200", "fp8") == "h200-fp8"
    assert profile_directory("h200", None, "fp8") == "h200-kvfp8"
    assert profile_directory("h200", "fp8", "fp8") == "h200-fp8-kvfp8"


def test_profile_takes_the_kv_cache_dtype() -> None:
    from cli.main import UsageError, build_parser

    parser = build_parser()
    assert parser.parse_args(["profile"]).kv_cache_dtype == "auto"
    assert parser.parse_args(["profile", "--kv-cache-dtype", "fp8"]).kv_cache_dtype == "fp8"
    with pytest.raises(UsageError, match="invalid choice: 'fp16'"):
        parser.parse_args(["profile", "--kv-cache-dtype", "fp16"])


def live_log(folder: Path, **config: Any) -> Path:
    """A live iteration log of two iterations, beside the summary.json of a run with `config`."""
    folder.mkdir()
    log = folder / "iterations.csv"
    log.write_text(
        "worker,start,end,gpu_s,items,cycle_s\n"
        "0,1.0,1.25,0.2,d:32:1819;d:32:900,0.5\n"
        "0,1.5,1.75,0.2,p:100:100,0.0\n"
    )
    (folder / "summary.json").write_text(
        json.dumps({"config": {"model": "llada-8b", "gpu": "h200", **config}})
    )
    return log


def test_from_log_refits_the_fp8_profile_with_logs_of_fp8_runs_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sangam profile --from-log LOG --quantization fp8 --kv-cache-dtype fp8` merges into (a copy of) the
    shipped FP8 profile and refits it; a log of another run's weights or KV cache is refused there, and a
    log of an FP8 run is refused by the bf16 profile, and so is a log without its run's summary.json by the
    FP8 profile: one line, exit 2, nothing written."""
    root = tmp_path / "data"
    shutil.copytree(DATA / "h200-fp8-kvfp8", root / "h200-fp8-kvfp8")
    (root / "h200").mkdir()
    (root / "h200" / "llada-8b.csv").write_text("items,seconds\np:100:100,0.01\n")
    (root / "h200" / "llada-8b.meta.json").write_text("{}")
    fp8 = live_log(tmp_path / "fp8", quantization="fp8", kv_cache_dtype="fp8")
    bf16 = live_log(tmp_path / "bf16", quantization=None, kv_cache_dtype="auto")
    old = live_log(tmp_path / "old", kv_cache_dtype="fp8")  # no quantization recorded: bf16 weights
    bare = live_log(tmp_path / "bare", quantization="fp8", kv_cache_dtype="fp8")
    (bare.parent / "summary.json").unlink()  # a log alone: nothing says what its run had
    refit = ["profile", "--model", "llada-8b", "--gpu", "h200", "--out", str(root)]
    quantized = [*refit, "--quantization", "fp8", "--kv-cache-dtype", "fp8"]

    def files() -> dict[Path, bytes]:
        return {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}

    before = files()
    refused = [
        (quantized, bf16, "its run was quantization 'none', not 'fp8'"),
        (quantized, old, "its run was quantization 'none', not 'fp8'"),
        (
            quantized,
            live_log(tmp_path / "kv", quantization="fp8"),
            "its run was kv_cache_dtype 'auto', not 'fp8'",
        ),
        (refit, fp8, "its run was quantization 'fp8', not 'none'"),
        (quantized, bare, "no summary.json beside it shows that its run had this profile's weights and KV"),
    ]
    for args, log, message in refused:
        assert main([*args, "--from-log", str(log)]) == 2
        err = capsys.readouterr().err
        assert f"{log}: {message}" in err and err.count("\n") == 1
    assert files() == before
    assert main([*quantized, "--from-log", str(fp8)]) == 0
    out = capsys.readouterr().out.splitlines()
    data = root / "h200-fp8-kvfp8" / "llada-8b.csv"
    assert out[0] == f"merged 2 iterations into {data}"
    shipped = len(read_samples(DATA / "h200-fp8-kvfp8" / "llada-8b.csv"))
    assert len(read_samples(data)) == shipped + 2
    assert out[1].startswith(f"llada-8b on h200: {shipped + 2} iterations")  # the FP8 profile's refit
    fit = json.loads((root / "h200-fp8-kvfp8" / "llada-8b.fit.json").read_text())
    assert fit["points"] == shipped + 2
    merged = json.loads((root / "h200-fp8-kvfp8" / "llada-8b.meta.json").read_text())["merged_logs"]
    assert [entry["log"] for entry in merged] == ["fp8/iterations.csv"]
    assert (root / "h200" / "llada-8b.csv").read_bytes() == before[root / "h200" / "llada-8b.csv"]
    assert merge_log("llada-8b", "h200", [bf16], root) == 2  # the bf16 profile takes a bf16 run's log


def test_the_fp8_grid_holds_every_shape_of_the_reference_peer_profile() -> None:
    """`peer_profile.py compare --ours <fp8 csv>` sets the reference's bf16 times beside every shape."""
    ours = {shape.format() for shape in profile_runner.grid(LLADA_FP8_PAGES)}
    for model in ("llada-8b", "dream-7b"):
        reference = [shape.format() for shape, _ in read_samples(REFERENCE / f"reference-{model}.csv")]
        assert len(reference) >= 90 and set(reference) <= ours, model
    assert LLADA_FP8_PAGES == 2 * LLADA_BF16_PAGES + 1  # the floor of twice the quotient


def small_cpu_profile(monkeypatch: pytest.MonkeyPatch, root: Path, kv_cache_dtype: str) -> tuple[Path, Path]:
    """`run_profile` as `sangam profile` calls it, on CPU with the tiny twin over three shapes."""
    shapes = [Shape((256,), ()), Shape((), (300, 1819)), Shape((512,), (1819,))]
    monkeypatch.setattr(profile_runner, "profile_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(
        profile_runner, "build_model", lambda name, *a, **k: build_model("tiny-llada", *a, **k)
    )
    monkeypatch.setattr(profile_runner, "grid", lambda capacity: shapes)
    return profile_runner.run_profile(
        "llada-8b", "h200", root, repeats=1, quantization="fp8", kv_cache_dtype=kv_cache_dtype
    )


def test_an_fp8_kv_profile_stores_fp8_pages_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    caches = []
    real = profile_runner.PagedKVCache.for_model

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        caches.append(real(*args, **kwargs))
        return caches[-1]

    monkeypatch.setattr(profile_runner.PagedKVCache, "for_model", spy)
    data, meta_path = small_cpu_profile(monkeypatch, tmp_path, "fp8")
    assert data == tmp_path / "h200-fp8-kvfp8" / "llada-8b.csv"
    assert caches[-1].layers[0].dtype == torch.float8_e4m3fn
    meta = json.loads(meta_path.read_text())
    assert (meta["quantization"], meta["kv_cache_dtype"]) == ("fp8", "fp8")
    assert meta["kv_pages"] == LLADA_FP8_PAGES and meta["device_name"] == "cpu"
    assert [shape.format() for shape, _ in read_samples(data)] == ["p:256:256", "d:32:300;d:32:1819",
                                                                   "p:512:512;d:32:1819"]  # fmt: skip
    _, bf16_meta = small_cpu_profile(monkeypatch, tmp_path, "auto")
    assert json.loads(bf16_meta.read_text())["kv_pages"] == LLADA_BF16_PAGES
    assert caches[-1].layers[0].dtype == torch.float32  # the CPU model's own


def test_compare_reads_a_profile_csv_against_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Our CSV (every grid shape, written as `run_profile` writes it) at half the reference's times."""
    reference = REFERENCE / "reference-llada-8b.csv"
    times = dict((shape.format(), seconds) for shape, seconds in read_samples(reference))
    ours = tmp_path / "llada-8b.csv"
    with ours.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["items", "seconds"])
        for shape in profile_runner.grid(LLADA_FP8_PAGES):
            items = shape.format()
            writer.writerow([items, f"{times.get(items, 1.0) / 2:.6e}"])
    assert peer_profile.main(["compare", "--ours", str(ours), "--reference", str(reference)]) == 0
    last = capsys.readouterr().out.splitlines()[-1].split()
    assert last == ["all", str(len(times)), "2.00", "2.00", "2.00"]


def fp8_profile_dir(tmp_path: Path) -> Path:
    """Our measured H200 LLaDA profile, relabelled as measured with FP8 weights and an FP8 KV cache."""
    directory = tmp_path / "h200-fp8-kvfp8"
    directory.mkdir()
    shutil.copy(DATA / "h200" / "llada-8b.csv", directory)
    shutil.copy(DATA / "h200" / "llada-8b.fit.json", directory)  # its fit, not redone (minutes on 2 cores)
    meta = json.loads((DATA / "h200" / "llada-8b.meta.json").read_text())
    meta.update(quantization="fp8", kv_cache_dtype="fp8", kv_pages=LLADA_FP8_PAGES)
    (directory / "llada-8b.meta.json").write_text(json.dumps(meta))
    return directory


def sim_pages(tmp_path: Path, testbed: str, *flags: str) -> tuple[int, str]:
    out = tmp_path / "sim"
    shutil.rmtree(out, ignore_errors=True)
    assert (
        main(
            ["sim", "--testbed", testbed, "--mode", "1C", "-n", "10", "--qps", "1", *flags, "--out", str(out)]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    return summary["config"]["kv_pages"], summary["cost_model"]


def test_fit_makes_an_fp8_testbed_whose_fp8_pages_are_not_doubled_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = fp8_profile_dir(tmp_path)
    out = tmp_path / "beds"
    args = ["fit", "--profile", str(directory), "--testbed", "sangam-h200", "--name", "my-h200-fp8"]
    assert main([*args, "--out", str(out)]) == 0
    assert f"llada-8b {LLADA_FP8_PAGES} pages of fp8 KV" in capsys.readouterr().out
    testbed = out / "my-h200-fp8.json"
    raw = json.loads(testbed.read_text())
    assert raw["profile"]["data"] == str(directory) and raw["version"] == 1 and "fit" not in raw
    assert "fp8 weights, fp8 KV" in raw["profile"]["source"]
    pages, cost = sim_pages(tmp_path, str(testbed), "--kv-cache-dtype", "fp8")
    assert pages == LLADA_FP8_PAGES and str(directory) in cost  # priced by the FP8 profile
    assert sim_pages(tmp_path, str(testbed))[0] == LLADA_FP8_PAGES // 2  # bf16 pages in the same memory
    # the shipped bf16 testbed's pages (its profile's live worker's) still double
    shipped = json.loads((DATA / "h200" / "llada-8b.meta.json").read_text())["kv_pages"]
    assert sim_pages(tmp_path, "sangam-h200", "--kv-cache-dtype", "fp8")[0] == 2 * shipped


def test_fit_profile_needs_data_of_the_base_testbeds_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["fit", "--testbed", "sangam-h100", "--out", str(tmp_path)]
    assert main([*args, "--profile", str(tmp_path)]) == 2
    assert "no <model>.csv with its .meta.json" in capsys.readouterr().err
    fp8 = str(fp8_profile_dir(tmp_path))
    assert main([*args, "--profile", fp8]) == 2
    err = capsys.readouterr().err
    assert "measured on h200, not sangam-h100's h100" in err and err.count("\n") == 1
    assert main([*args, "--profile", str(tmp_path), "--blocks", str(tmp_path)]) == 2
    assert "--blocks DIR..., --loop DIR... or --profile DIR" in capsys.readouterr().err
    # the reference's testbeds price its loop beside its profile: not a base for a profile of ours
    assert (
        main(
            [
                "fit",
                "--testbed",
                "reference-h200",
                "--out",
                str(tmp_path),
                "--profile",
                fp8,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "reference-h200 carries another executor's worker loop or handoff" in err and err.count("\n") == 1


@pytest.mark.parametrize("testbed", ["reference-h200", "reference-h100", "paper-h100"])
def test_the_reference_testbeds_refuse_an_fp8_kv_cache_in_one_line(
    testbed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", "--testbed", testbed, "--mode", "1C", "-n", "5", "--kv-cache-dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"testbed {testbed} prices the reference implementation (UT-InfraAI/sangam)" in err
    assert "--kv-cache-dtype fp8 needs a sangam-* testbed" in err


def test_the_shipped_fp8_testbed_is_what_fit_makes_of_the_shipped_fp8_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """profiles/data/testbeds/sangam-h200-fp8.json is `sangam fit --profile` of the H200 call's profile, then
    `sangam fit --loop` of the ninth round's live runs, the -10 ones (under names of their own then; a
    shipped name is not replaced), and a run on it takes the FP8 pages its worker recorded (halved for a
    bf16 KV cache in the same memory)."""
    meta = json.loads((DATA / "h200-fp8-kvfp8" / "llada-8b.meta.json").read_text())
    assert (meta["gpu"], meta["quantization"], meta["kv_cache_dtype"]) == ("h200", "fp8", "fp8")
    args = ["fit", "--profile", str(DATA / "h200-fp8-kvfp8"), "--testbed", "sangam-h200"]
    assert main([*args, "--name", "again", "--out", str(tmp_path)]) == 0
    runs = [str(NINTH_ROUND / f"seed{seed}" / "live-qps1.84") for seed in (13, 14, 15)]
    looped = ["fit", "--loop", *runs, "--testbed", str(tmp_path / "again.json"), "--name", "looped"]
    assert main([*looped, "--out", str(tmp_path)]) == 0
    made = json.loads((tmp_path / "looped.json").read_text())
    assert made | {"name": "sangam-h200-fp8"} == json.loads(
        (DATA / "testbeds" / "sangam-h200-fp8.json").read_text()
    )
    assert made["profile"]["data"] == "h200-fp8-kvfp8"  # shipped data, named inside profiles/data
    assert "live-colocated-fp8-llada-8b-h200-10/seed13" in made["loop"]["other_ms"]["source"]
    pages, cost = sim_pages(tmp_path, "sangam-h200-fp8", "--kv-cache-dtype", "fp8")
    assert pages == meta["kv_pages"] and cost == f"h200-fp8-kvfp8 profile, measured, {LOOP}"
    assert sim_pages(tmp_path, "sangam-h200-fp8")[0] == meta["kv_pages"] // 2
