"""Profile data on disk and the cost model `sangam sim` uses by default.

`profiles/data/<gpu>/<model>.csv` holds measured iterations (`items`, `seconds`, ...);
`<model>.meta.json` what they were measured on (GPU, versions, grid, KV pages of the live worker,
the decode batch sizes replayed as CUDA graphs); `<model>.fit.json` the fitted coefficients, the graph
buckets' own lines (`graph_times`) and their held-out errors, cached by the hash of the CSV and the
graphed batch sizes. A GPU without data of its own takes a profile derived from one that has it, marked
`derived` (H100 from H200: bandwidth-bound terms scaled; the buckets' lines, measured on one GPU only,
are left out).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from contextlib import suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from profiles.analytic import AnalyticCostModel
from profiles.measured import Coefficients, Features, GraphTimes, MeasuredCostModel, shape_seconds
from profiles.shapes import Shape
from runs.live_summary import check_measured, run_config
from sangam.cost import CostModel
from sangam.hardware import lookup_gpu, lookup_model

DATA = Path(__file__).parent / "data"
COEFFICIENT_NAMES = {f.name for f in fields(Coefficients)}
DERIVED_FROM = {"h100": "h200"}  # GPU without measurements -> the GPU its profile is derived from


@dataclass(frozen=True, slots=True)
class Profile:
    """A fitted iteration-time model and where it comes from."""

    model: str
    gpu: str
    coefficients: Coefficients
    meta: dict[str, Any]
    report: dict[str, Any]
    derived_from: str | None = None
    graphs: GraphTimes | None = None  # the graph buckets' own lines (None: the shared model prices them)

    def cost_model(self) -> MeasuredCostModel:
        return MeasuredCostModel(self.coefficients, self.buckets, self.graphs)

    def price(self, shape: Shape) -> float:
        """What the cost model charges for an iteration of `shape`."""
        return shape_seconds(self.coefficients, self.graphs, shape, self.buckets)

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(self.meta.get("graph_buckets", ()))

    @property
    def kv_pages(self) -> int | None:
        pages = self.meta.get("kv_pages")
        return int(pages) if pages is not None else None

    @property
    def kv_cache_dtype(self) -> str:
        """What its worker's KV pages stored (`--kv-cache-dtype`; profiles before the flag: auto)."""
        return str(self.meta.get("kv_cache_dtype", "auto"))

    @property
    def peer(self) -> str | None:
        """The other implementation whose executor it timed (the reference's), None for ours."""
        peer = self.meta.get("peer")
        return str(peer) if peer is not None else None


def default_cost_model(model: str, gpu: str) -> tuple[CostModel, str, Profile | None]:
    """What `sangam sim` prices iterations with: the (measured or derived) profile, else analytic."""
    profile = load_profile(model, gpu)
    if profile is None:
        return AnalyticCostModel(lookup_model(model), lookup_gpu(gpu)), "analytic", None
    name = f"derived from {profile.derived_from}" if profile.derived_from else "measured"
    return profile.cost_model(), name, profile


def paths(model: str, gpu: str, root: Path = DATA) -> tuple[Path, Path, Path]:
    base = root / gpu / model
    return base.with_suffix(".csv"), base.with_suffix(".meta.json"), base.with_suffix(".fit.json")


def profile_directory(gpu: str, quantization: str | None, kv_cache_dtype: str = "auto") -> str:
    """Where a profile of `gpu` lives under the data root: `h200`; `h200-fp8` for FP8 weights, `h200-kvfp8`
    for an FP8 KV cache, `h200-fp8-kvfp8` for both."""
    suffixes = [quantization] if quantization is not None else []
    if kv_cache_dtype != "auto":
        suffixes.append(f"kv{kv_cache_dtype}")
    return "-".join([gpu, *suffixes])


def live_seconds(row: dict[str, str]) -> float:
    """What one live iteration cost its worker: to the loop's next start when the loop went straight on
    (`cycle_s`: reporting and admitting included), else `end - start`. A profile refitted from live logs
    prices the loop with the step, so a testbed on it must not charge the loop again (`sangam fit --loop`)."""
    cycle = float(row.get("cycle_s") or 0.0)
    return cycle if cycle > 0 else float(row["end"]) - float(row["start"])


def read_samples(path: Path) -> list[tuple[Shape, float]]:
    """(shape, seconds) of every measured iteration in a profile CSV or a live iteration log
    (`live_seconds`: host work included, like a profile's)."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason})") from None
    columns = set(rows[0]) if rows else set()
    if rows and not ({"items", "seconds"} <= columns or {"items", "start", "end"} <= columns):
        raise ValueError(
            f"{path}: neither a profile (items, seconds) nor a live iteration log (items, start, end)"
        )
    samples = []
    for line, row in enumerate(rows, start=2):
        if not row["items"]:
            continue
        try:
            seconds = float(row["seconds"]) if "seconds" in row else live_seconds(row)
            if not 0 < seconds < math.inf:
                raise ValueError(f"an iteration must take a positive finite time, got {seconds}")
            samples.append((Shape.parse(row["items"]), seconds))
        except (ValueError, TypeError) as error:  # TypeError: a short row's missing field is None
            raise ValueError(f"{path}, line {line}: {error}") from None
    return samples


def load_profile(model: str, gpu: str, root: Path = DATA) -> Profile | None:
    """The measured (or derived) profile of `model` on `gpu`, fitting it if the cache is stale."""
    lookup_model(model)
    lookup_gpu(gpu)
    if paths(model, gpu, root)[0].exists():
        return load_profile_dir(model, gpu, gpu, root)
    source = DERIVED_FROM.get(gpu)
    return load_profile_dir(model, source, gpu, root) if source else None


def load_profile_dir(model: str, directory: str, gpu: str, root: Path = DATA) -> Profile | None:
    """The profile measured in `root/directory/` (its metadata names the GPU it ran on), derived to
    `gpu` when that is another GPU (as `load_profile` derives H100 from H200); None without data."""
    lookup_model(model)
    target = lookup_gpu(gpu)
    data, meta_path, _ = paths(model, directory, root)
    if not data.exists():
        return None
    meta = json.loads(meta_path.read_text())
    measured_on = str(meta.get("gpu", directory))
    coefficients, graphs, report = _fitted(model, directory, meta, root)
    if measured_on == gpu:
        return Profile(model, gpu, coefficients, meta, report, graphs=graphs)
    ratio = lookup_gpu(measured_on).tb_per_s / target.tb_per_s
    meta = {**meta, "gpu": gpu, "derived": True, "bandwidth_ratio": ratio, "data": directory}
    meta.pop("kv_pages", None)  # memory differs: pages come from the GPU's memory, not the source's
    return Profile(model, gpu, coefficients.derived(ratio), meta, report, derived_from=measured_on)


def _fitted(
    model: str, gpu: str, meta: dict[str, Any], root: Path
) -> tuple[Coefficients, GraphTimes | None, dict[str, Any]]:
    data, _, cache = paths(model, gpu, root)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    buckets = list(meta.get("graph_buckets", ()))
    if cache.exists():
        with suppress(ValueError):  # an unreadable cache is refitted
            cached = json.loads(cache.read_text())
            # the fit also depends on the graphed batch sizes and on the model's terms
            key = (
                cached.get("data_sha256"),
                cached.get("graph_buckets"),
                set(cached.get("coefficients", ())),
                "graph_times" in cached,
            )
            if key == (digest, buckets, COEFFICIENT_NAMES, True):
                return Coefficients(**cached["coefficients"]), _graph_times(cached["graph_times"]), cached
    from profiles.fit import Sample, fit, fit_graphs  # numpy (and scipy): only once the cache is stale

    measured = read_samples(data)
    samples = [Sample(Features.of(shape, tuple(buckets)), seconds) for shape, seconds in measured]
    graphs = fit_graphs(measured, buckets)
    report = {
        **fit(samples).as_dict(),
        "graph_times": graphs.as_dict() if graphs is not None else None,
        "data_sha256": digest,
        "graph_buckets": buckets,
    }
    cache.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return Coefficients(**report["coefficients"]), _graph_times(report["graph_times"]), report


def _graph_times(record: dict[str, Any] | None) -> GraphTimes | None:
    if record is None:
        return None
    return GraphTimes(tuple(record["buckets"]), tuple(record["fixed"]), tuple(record["per_longest"]))


def merge_log(
    model: str,
    gpu: str,
    logs: list[Path],
    root: Path = DATA,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> int:
    """Append the iterations of live logs to the data of the profile of `model` on `gpu` with those weights
    and KV cache (`profile_directory`; its fit is redone on next load); how many were appended."""
    directory = profile_directory(gpu, quantization, kv_cache_dtype)
    data, meta, _ = paths(model, directory, root)
    if not meta.exists():
        raise ValueError(f"no profile of {model} in {meta.parent} to refit: run sangam profile first")
    record = json.loads(meta.read_text())
    text = data.read_bytes()
    seen = {entry.get("sha256") for entry in record.get("merged_logs", ())}
    seen.add(hashlib.sha256(text).hexdigest())  # the data file itself
    merged = []  # all checked and read before anything is written
    for log in logs:
        digest = hashlib.sha256(log.read_bytes()).hexdigest()
        if digest in seen:
            raise ValueError(f"{log}: already in the {model} profile's data in {directory}")
        seen.add(digest)
        _check_log_run(log, model, gpu, quantization, kv_cache_dtype)
        samples = read_samples(log)
        if not samples:  # would only refit the profile as it was, for a minute
            raise ValueError(f"{log}: no iterations to merge")
        merged.append((log, digest, samples))
    with data.open("a", newline="") as f:
        if text and not text.endswith(b"\n"):
            f.write("\r\n")  # a hand-edited file without its last line end
        for _, _, samples in merged:
            csv.writer(f).writerows((shape.format(), f"{seconds:.6e}") for shape, seconds in samples)
    record["merged_logs"] = record.get("merged_logs", []) + [
        {"log": f"{log.parent.name}/{log.name}", "iterations": len(samples), "sha256": digest}
        for log, digest, samples in merged
    ]
    meta.write_text(json.dumps(record, indent=2) + "\n")
    return sum(len(samples) for _, _, samples in merged)


def _check_log_run(log: Path, model: str, gpu: str, quantization: str | None, kv_cache_dtype: str) -> None:
    """ValueError if the live run beside `log` (its summary.json) ran another model, GPU, quantization or
    KV cache dtype; a run that recorded no quantization (from before it was recorded) had bf16 weights. A
    bare log (no summary.json) merges into a bf16 profile only: nothing shows it ran FP8 weights or KV."""
    summary = log.parent / "summary.json"
    if not summary.is_file():
        if quantization is None and kv_cache_dtype == "auto":
            return
        shown = "no summary.json beside it shows that its run had this profile's weights and KV"
        raise ValueError(f"{log}: {shown}")
    config = run_config(log.parent)
    check_measured(config, str(log))
    ran = (
        config.get("model", model),
        config.get("gpu", gpu),
        config.get("quantization") or "none",
        config.get("kv_cache_dtype", "auto"),
    )
    wanted = (model, gpu, quantization or "none", kv_cache_dtype)
    for key, was, value in zip(("model", "gpu", "quantization", "kv_cache_dtype"), ran, wanted, strict=True):
        if was != value:
            raise ValueError(f"{log}: its run was {key} {was!r}, not {value!r}")
