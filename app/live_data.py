"""A `sangam live` results directory (summary.json, requests.csv, optional blocks.csv) and the simulated
twin of its run: the same config and the same requests (arrivals, lengths and, from blocks.csv, every
block's forwards). No Streamlit here."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from app.inputs import InputError
from app.sweep import PointSpec
from profiles.testbed import Testbed
from profiles.testbeds import known_testbeds, load_testbed
from runs.config import RunConfig
from runs.live_summary import finite_number
from runs.results import METRICS
from sangam.hardware import BLOCK, MODELS
from sangam.workload import TraceRow, check_steps
from sim.options import options_on_testbed

FILES = ("summary.json", "requests.csv", "blocks.csv")  # the last is optional
# a live run's (--quantization, --kv-cache-dtype) -> the testbed priced for it (sangam-h200-fp8's profile,
# profiles/data/h200-fp8-kvfp8, was measured with FP8 weights and FP8 KV)
LIVE_TESTBEDS = {(None, "auto"): "sangam-{gpu}", ("fp8", "fp8"): "sangam-{gpu}-fp8"}
REQUEST_NEEDS = ("request_id", "arrival", "prompt_len", "output_len", "seq_len", "e2el", "queue", "decode")
BLOCK_NEEDS = ("request_id", "block", "forwards")
COMPARED = (
    *(f"{stat}_{metric}_ms" for metric in METRICS for stat in ("mean", "median", "p99")),
    "request_throughput",
    "output_throughput",
    "overflow_rate",
    "kv_transferred_gb",
    "completed",
)


@dataclass(frozen=True, slots=True)
class LiveRun:
    summary: dict[str, Any]
    requests: pd.DataFrame
    blocks: pd.DataFrame | None
    digest: str  # sha256 over the files read


def load_files(files: Mapping[str, bytes]) -> LiveRun:
    """A live run from file name -> bytes; summary.json and requests.csv are required."""
    missing = [name for name in FILES[:2] if name not in files]
    if missing:
        raise InputError(f"missing {' and '.join(missing)}: give the files `sangam live --out DIR` wrote")
    try:
        summary = json.loads(files["summary.json"].decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"summary.json is not valid JSON: {err}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
        raise InputError("summary.json has no 'config' object: is it a sangam sim/live summary?")
    _check_summary(summary)
    requests = _table(files["requests.csv"], "requests.csv", REQUEST_NEEDS)
    blocks = _table(files["blocks.csv"], "blocks.csv", BLOCK_NEEDS) if "blocks.csv" in files else None
    digest = hashlib.sha256(b"".join(files[name] for name in FILES if name in files)).hexdigest()
    return LiveRun(summary, requests, blocks, digest)


def _check_summary(summary: Mapping[str, Any]) -> None:
    """InputError naming the first value the page reads from summary.json that is not a number."""
    values = {key: summary[key] for key in (*COMPARED, "control_ms") if key in summary}
    link = summary.get("kv_link")
    if "kv_link" in summary:
        if not isinstance(link, dict):
            raise InputError(f"summary.json: kv_link must be an object, got {link!r}")
        values.update({f"kv_link.{key}": link.get(key) for key in ("gb_per_s", "latency_s")})
    for key, value in values.items():
        if not finite_number(value):
            raise InputError(f"summary.json: {key} must be a finite number, got {value!r}")


def load_directory(path: str | Path) -> LiveRun:
    """A live run from a results directory on this machine."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise InputError(f"{folder}: no such results directory")
    return load_files({name: (folder / name).read_bytes() for name in FILES if (folder / name).is_file()})


def _table(data: bytes, name: str, needs: tuple[str, ...]) -> pd.DataFrame:
    try:
        table = pd.read_csv(io.BytesIO(data))
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{name} is not a readable CSV file: {str(err).splitlines()[0]}") from None
    missing = [c for c in needs if c not in table.columns]
    if missing:
        raise InputError(f"{name} lacks the column(s) {', '.join(missing)}")
    if table.empty:
        raise InputError(f"{name} has no rows")
    numeric = table[list(needs)].apply(pd.to_numeric, errors="coerce")
    if numeric.isna().any().any():
        column = numeric.columns[numeric.isna().any()][0]
        raise InputError(f"{name}: column {column} has a blank or non-numeric value")
    return table


def live_config(run: LiveRun) -> RunConfig:
    """The run's RunConfig (from summary.json's resolved config), for exactly its finished requests."""
    try:  # kv_pages: the pool the live workers really had
        return RunConfig.from_resolved(run.summary["config"], num_requests=len(run.requests))
    except (TypeError, ValueError) as err:
        raise InputError(f"summary.json's config is not a sangam config: {err}") from None


def live_rows(run: LiveRun) -> tuple[TraceRow, ...]:
    """The live run's requests in arrival order; each block's forwards too when blocks.csv is given.

    A request that stopped early (real weights commit EOS) ran fewer blocks than its output length
    asks for; its output length becomes 32 tokens per block run, so the sim does the same work. Each
    row's max_tokens is the request's own mask buffer (`seq_len - prompt_len`), which a server sizes
    per request.
    """
    steps: dict[int, tuple[int, ...]] = {}
    if run.blocks is not None:
        ordered = run.blocks.sort_values(["request_id", "block"])
        for rid, group in ordered.groupby("request_id"):
            # whole numbers become ints, anything else stays as read, so the trace's own rule refuses it
            forwards = tuple(int(d) if float(d).is_integer() else float(d) for d in group["forwards"])
            try:
                check_steps(forwards, BLOCK * len(forwards))
            except ValueError as err:
                raise InputError(f"blocks.csv: request {rid}: {err}") from None
            steps[int(rid)] = tuple(int(d) for d in forwards)  # all whole once checked
    rows = []
    try:
        for req in run.requests.sort_values(["arrival", "request_id"]).itertuples():
            plan = steps.get(int(req.request_id))
            output_len = int(req.output_len)
            if plan is not None and len(plan) != -(-output_len // 32):
                output_len = 32 * len(plan)
            mask_len = int(req.seq_len) - int(req.prompt_len)
            rows.append(TraceRow(int(req.prompt_len), output_len, float(req.arrival), plan, mask_len))
    except ValueError as err:
        raise InputError(f"requests.csv: {err}") from None
    return tuple(rows)


def twin_testbed(summary: Mapping[str, Any]) -> Testbed:
    """The testbed that models the run on its own model, device, weights and KV cache: a simulated run's
    own testbed, a live run's `sangam-<gpu>` (our executor's profiles on its GPU), or `sangam-<gpu>-fp8`
    for FP8 weights and an FP8 KV cache. InputError saying why none does: a run on CPU workers, of a
    model the simulator has no iteration times for (the tiny test models), or on a GPU or with weights
    and a KV cache that no shipped testbed is priced for; comparing such a run with a simulation of other
    hardware or kernels would report a difference that only says they differ."""
    cfg = summary["config"]
    served = str(cfg.get("live_model") or cfg.get("model"))
    devices = [str(d) for d in cfg.get("devices") or []]
    cpus = sum(d.startswith("cpu") for d in devices)
    known = known_testbeds()
    if cpus:
        raise InputError(
            f"this run served {served} on {cpus} CPU worker{'s' if cpus > 1 else ''}: the simulator prices "
            f"iterations from GPU profiles only (testbeds {', '.join(known)}), so it has no twin of this "
            "run; compare a run on a GPU"
        )
    if served != cfg.get("model"):
        raise InputError(
            f"this run served {served}, not {cfg.get('model')}: the simulator has iteration times of "
            f"{', '.join(MODELS)} only, so it has no twin of this run"
        )
    name = summary.get("testbed")
    if name is None:
        kind = (cfg.get("quantization"), cfg.get("kv_cache_dtype", "auto"))
        if kind not in LIVE_TESTBEDS:
            raise InputError(
                f"this run had --quantization {kind[0] or 'none'} and --kv-cache-dtype {kind[1]}, and no "
                "shipped testbed is priced for those (sangam-<gpu>: bf16 weights and KV, sangam-<gpu>-fp8: "
                "FP8 weights and KV; a summary.json that records no quantization is of bf16 weights)"
            )
        name = LIVE_TESTBEDS[kind].format(gpu=cfg.get("gpu"))
    if name not in known:
        raise InputError(f"no shipped testbed models this run ({name}; known: {', '.join(known)})")
    return load_testbed(name)


def twin_notes(summary: Mapping[str, Any]) -> list[str]:
    """What the twin of a run it can simulate still leaves out."""
    devices = [str(d) for d in summary["config"].get("devices") or []]
    notes = []
    if len(set(devices)) < len(devices):
        notes.append(
            f"{len(devices)} workers shared {len(set(devices))} GPU{'s' if len(set(devices)) > 1 else ''} "
            f"({', '.join(devices)}); the simulator gives each worker a whole GPU, so the live run's "
            "contention for it is not modelled"
        )
    return notes


def twin_spec(run: LiveRun, progress: str = "", cost: str = "profile") -> PointSpec:
    """The simulation of the run's config on its own requests, on the testbed that models its model and
    device (`twin_testbed`; InputError if none does): its profiles, its KV link and control delay unless
    the run records its own (a simulated run), and its forwards per block unless blocks.csv or
    `progress` give them."""
    bed = twin_testbed(run.summary)
    cfg = live_config(run)
    if run.blocks is not None:
        progress = ""  # blocks.csv fixes every block's forwards
    elif not progress:
        progress = bed.progress_spec(cfg.model, cfg.trace if cfg.is_synthetic else "sharegpt")
    given: dict[str, Any] = {"cost": cost}
    link, control_ms = run.summary.get("kv_link"), run.summary.get("control_ms")  # a sim run's own
    if link is not None:  # numbers if given, as load_files checked
        given.update(link_gbps=float(link["gb_per_s"]), link_latency_ms=1000 * float(link["latency_s"]))
    if control_ms is not None:
        given["control_ms"] = float(control_ms)
    return PointSpec(cfg, progress, live_rows(run), run.digest, options_on_testbed(bed, given))


def comparison_frame(live: Mapping[str, Any], sim: Mapping[str, Any]) -> pd.DataFrame:
    """Summary values side by side: live, sim, and sim's difference from live in percent."""
    rows = []
    for key in COMPARED:
        if key in live and key in sim:
            a, b = float(live[key]), float(sim[key])
            diff = 100 * (b - a) / a if a else float("nan")
            rows.append({"metric": key, "live": a, "sim": b, "sim_vs_live_pct": diff})
    return pd.DataFrame(rows)
