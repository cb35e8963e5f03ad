"""The live KV link, measured and fitted: the link profiles `sim.links.load_link` reads.

    python -m calib.link_fit measure --name cpu-gloo --device cpu

measures the live KV transfer path (`executor.transfer.links`: pack, send, receive, unpack, from the sender's
start to the receiver's end) for several sizes between two processes, fits seconds = latency + bytes /
bandwidth, and writes the link profile `profiles/data/links/<name>.json`.

    python -m calib.link_fit fit-results --results DIR --name NAME

fits the same model to the transfers a `sangam live` run recorded.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from executor.run.ports import free_port
from executor.transfer.links import TRANSPORTS, KVPacker, LinkConfig, PairLink, one_line, open_store
from sangam.hardware import PAGE, lookup_model

REPO_ROOT = Path(__file__).resolve().parent.parent
LINKS_DIR = REPO_ROOT / "profiles" / "data" / "links"
DEFAULT_PAGES = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True, slots=True)
class Fit:
    latency_s: float
    gb_per_s: float
    r2: float
    max_rel_error: float


def fit_link(points: Sequence[tuple[int, float]]) -> Fit:
    """seconds = latency + bytes / bandwidth by least squares weighted by 1/seconds^2 (relative error)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fitting a link needs at least two sizes")
    w = [1.0 / max(s, 1e-9) ** 2 for _, s in points]
    sw = sum(w)
    mx = sum(wi * b for wi, (b, _) in zip(w, points, strict=True)) / sw
    my = sum(wi * s for wi, (_, s) in zip(w, points, strict=True)) / sw
    sxx = sum(wi * (b - mx) ** 2 for wi, (b, _) in zip(w, points, strict=True))
    sxy = sum(wi * (b - mx) * (s - my) for wi, (b, s) in zip(w, points, strict=True))
    slope = sxy / sxx
    latency = my - slope * mx
    if slope <= 0:
        raise ValueError("the measured times do not grow with the size: cannot fit a bandwidth")
    if latency < 0:  # refit through the origin: no negative latency
        latency = 0.0
        slope = sum(wi * b * s for wi, (b, s) in zip(w, points, strict=True)) / sum(
            wi * b * b for wi, (b, _) in zip(w, points, strict=True)
        )
    predicted = [latency + slope * b for b, _ in points]
    mean = statistics.fmean(s for _, s in points)
    ss_res = sum((s - p) ** 2 for (_, s), p in zip(points, predicted, strict=True))
    ss_tot = sum((s - mean) ** 2 for _, s in points) or 1e-30
    worst = max(abs(p - s) / s for (_, s), p in zip(points, predicted, strict=True))
    return Fit(latency, 1.0 / (slope * 1e9), 1.0 - ss_res / ss_tot, worst)


def recorded_command(argv: Sequence[str]) -> str:
    """The command line that made a profile, without `--out DIR` (a path of the measuring machine)."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg == "--out":
            skip = not skip
            continue
        if arg.startswith("--out="):
            continue
        kept.append(arg if arg.startswith("-") or " " not in arg else repr(arg))
    return " ".join(["python -m calib.link_fit", *kept])


def _bench(args: argparse.Namespace) -> int:
    """One end of the measurement (a child process of `measure`); rank 0 prints the points as JSON."""
    spec = lookup_model(args.model)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = open_store("127.0.0.1", args.port, is_master=args.rank == 0, timeout_s=args.setup_timeout)
    config = LinkConfig(args.transport, args.timeout, args.setup_timeout)
    link = PairLink(store, 0, 1, args.rank, config)
    link.ensure(0)
    sizes = [int(p) for p in args.pages.split(",")]
    pool = max(sizes) + 8
    shape = (pool, 2, PAGE, spec.kv_heads, spec.head_dim)
    layers = [
        torch.empty(shape, dtype=torch.bfloat16, device=device).uniform_(-1, 1) for _ in range(spec.layers)
    ]
    packer = KVPacker(layers, host_staging=args.transport == "gloo")
    rng = random.Random(1)
    points: list[dict[str, Any]] = []
    tag = 1
    for n in sizes:
        seconds = []
        for repeat in range(args.repeats + 1):  # the first is a warm-up
            pages = rng.sample(range(pool), n)
            key = f"bench/{tag}"
            store.set(f"{key}/ready{args.rank}", "1")
            store.wait([f"{key}/ready{1 - args.rank}"], datetime.timedelta(seconds=args.setup_timeout))
            start = time.monotonic()
            deadline = start + args.timeout
            if args.rank == 0:
                link.send(packer.pack(pages), tag, deadline)
                end = float(store.get(f"{key}/end").decode())
                if repeat:
                    seconds.append(end - start)
            else:
                buf = packer.buffer(n)
                link.recv(buf, tag, deadline)
                packer.unpack(pages, buf)
                store.set(f"{key}/end", repr(time.monotonic()))
            tag += 1
        if args.rank == 0:
            nbytes = n * packer.bytes_per_page
            points.append(
                {
                    "pages": n,
                    "bytes": nbytes,
                    "seconds_median": statistics.median(seconds),
                    "seconds_min": min(seconds),
                    "seconds_max": max(seconds),
                    "repeats": len(seconds),
                }
            )
    if args.rank == 0:
        meta = {"bytes_per_page": packer.bytes_per_page, "geometry": args.model, "dtype": "bfloat16"}
        print(json.dumps({"points": points, **meta}), flush=True)
    link.close()
    return 0


def measure(args: argparse.Namespace) -> Path:
    """Run both ends as child processes, fit the points, write the link profile; its path."""
    port = free_port()
    common = [
        "--port", str(port), "--transport", args.transport, "--device", args.device, "--model", args.model,
        "--pages", args.pages, "--repeats", str(args.repeats), "--timeout", str(args.timeout),
        "--setup-timeout", str(args.setup_timeout),
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "calib.link_fit", "_bench", "--rank", str(rank), *common],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        out, _ = procs[0].communicate(timeout=args.limit)
        procs[1].wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    if procs[0].returncode or procs[1].returncode:
        raise RuntimeError(f"the measurement failed (exit {procs[0].returncode}, {procs[1].returncode})")
    raw = json.loads(out.strip().splitlines()[-1])
    points = raw.pop("points")
    fit = fit_link([(p["bytes"], p["seconds_median"]) for p in points])
    profile = {
        "name": args.name,
        "description": args.note,
        "transport": args.transport,
        "device": args.device,
        "staging": "pinned host memory" if args.transport == "gloo" and args.device != "cpu" else "none",
        "path": "pack the pages of every layer -> send -> receive -> scatter into pages; seconds from the "
        "sender's start to the receiver's end, median of the repeats",
        **fit_fields(fit),
        **raw,
        "points": points,
        "host": {
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        },
        "measured": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": recorded_command(sys.argv[1:]),
    }
    return write_profile(profile, fit, Path(args.out), "")


def fit_fields(fit: Fit) -> dict[str, Any]:
    """A link profile's fitted figures, as `sim.links.load_link` reads them."""
    return {
        "gb_per_s": round(fit.gb_per_s, 4),
        "latency_s": round(fit.latency_s, 6),
        "fit": {
            "model": "seconds = latency_s + bytes / (gb_per_s * 1e9)",
            "method": "least squares weighted by 1/seconds^2",
            "r2": round(fit.r2, 5),
            "max_rel_error": round(fit.max_rel_error, 4),
        },
    }


def write_profile(profile: dict[str, Any], fit: Fit, out_dir: Path, source: str) -> Path:
    """Write `out_dir/<name>.json` and say what was fitted; the file's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{profile['name']}.json"
    path.write_text(json.dumps(profile, indent=2) + "\n")
    print(
        f"{profile['name']}: {fit.gb_per_s:.3f} GB/s, latency {1000 * fit.latency_s:.3f} ms{source} "
        f"(R^2 {fit.r2:.4f}, worst point off by {100 * fit.max_rel_error:.1f}%); wrote {path}"
    )
    return path


def live_points(results: Path, bytes_per_token: int | None = None) -> tuple[list[tuple[int, float]], str]:
    """(bytes, seconds) of every KV transfer of a `sangam live` run's results directory, and the model."""
    summary = json.loads((results / "summary.json").read_text())
    config = summary.get("config", {})
    model = config.get("model", "llada-8b")
    per_token = bytes_per_token or lookup_model(model).kv_bytes_per_token(
        config.get("kv_cache_dtype", "auto")
    )
    with (results / "requests.csv").open() as f:
        seq_len = {row["request_id"]: int(row["seq_len"]) for row in csv.DictReader(f)}
    points = []
    with (results / "blocks.csv").open() as f:
        for row in csv.DictReader(f):
            if row["transfer_start"] and row["transfer_end"]:
                seconds = float(row["transfer_end"]) - float(row["transfer_start"])
                points.append((seq_len[row["request_id"]] * per_token, seconds))
    return points, model


def fit_results(args: argparse.Namespace) -> Path:
    """Fit a link profile to the transfers a live run recorded (transfer_start to transfer_end)."""
    results = Path(args.results)
    points, model = live_points(results, args.bytes_per_token)
    if not points:
        raise ValueError(f"{results}: the run recorded no KV transfer")
    fit = fit_link(points)
    summary = json.loads((results / "summary.json").read_text())
    profile = {
        "name": args.name,
        "description": args.note,
        "source": f"the KV transfers of a sangam live run ({summary.get('config', {}).get('layout', '?')}, "
        f"{model}): seconds from the destination's link thread taking a transfer to the KV in its pages",
        **fit_fields(fit),
        "transfers": len(points),
        "points": [{"bytes": b, "seconds": round(t, 6)} for b, t in sorted(points)],
        "live_config": summary.get("config", {}),
        "command": recorded_command(sys.argv[1:]),
    }
    return write_profile(profile, fit, Path(args.out), f" from {len(points)} live transfers")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m calib.link_fit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("measure", "_bench"):
        sub = commands.add_parser(
            name,
            help="measure the KV transfer path, write a link profile"
            if name == "measure"
            else argparse.SUPPRESS,
        )
        sub.add_argument("--transport", choices=TRANSPORTS, default="gloo")
        sub.add_argument("--device", default="cpu", help="cpu, or cuda:N (both ends on it with gloo)")
        sub.add_argument(
            "--model", default="llada-8b", help="page geometry (layers, KV heads, head dim; bf16)"
        )
        sub.add_argument("--pages", default=",".join(map(str, DEFAULT_PAGES)), help="request sizes, in pages")
        sub.add_argument("--repeats", type=int, default=5)
        sub.add_argument("--timeout", type=float, default=60.0, help="seconds per transfer")
        sub.add_argument("--setup-timeout", type=float, default=60.0)
        if name == "measure":
            sub.add_argument(
                "--name", required=True, help="profile name (the file profiles/data/links/NAME.json)"
            )
            sub.add_argument("--note", default="", help="what was measured, where (goes into the file)")
            sub.add_argument("--out", default=str(LINKS_DIR))
            sub.add_argument("--limit", type=float, default=540.0, help="seconds for the whole measurement")
        else:
            sub.add_argument("--rank", type=int, required=True)
            sub.add_argument("--port", type=int, required=True)
    fit = commands.add_parser("fit-results", help="fit a link profile to the transfers of a live run")
    fit.add_argument("--results", required=True, help="a sangam live --out directory")
    fit.add_argument("--name", required=True, help="writes profiles/data/links/NAME.json")
    fit.add_argument("--bytes-per-token", type=int, help="KV bytes per token (default: the run's model)")
    fit.add_argument("--note", default="")
    fit.add_argument("--out", default=str(LINKS_DIR))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "_bench":
        return _bench(args)
    try:
        if args.command == "fit-results":
            fit_results(args)
        else:
            measure(args)
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        print(f"link_fit: error: {one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
