"""`sangam profile`: time our real worker's iterations over a grid of microbatch shapes.

Each point builds the microbatch in a fresh worker `Engine` (the live worker's own batcher,
model, paged KV cache, FlashInfer attention, CUDA graphs and sampler), runs `Engine.step()`
and takes the median wall time of the timed repeats after warm-up: exactly the iteration a
live worker runs, host work included. Decodes are seated with pages of their own (their KV
content does not change the time); prefills run for real.

Every timed step follows a `FILLER` of serving-like work, so the GPU meets each shape in the power state
serving puts it in. Timed back to back instead, a shape runs at the clock its own power draw allows: on
an H200 (700 W cap), LLaDA-8B's 2048-token prefill took 55.8 ms back to back (SM clock 1.56 GHz) against
50.1 ms between decodes (1.84 GHz), while a one-decode step took 6.5 ms back to back against 6.7 ms between
prefills. The filler is what a worker near its capacity runs: mostly prefills with decodes riding along,
between decode steps of a few items. A lighter one (a prefill, then four one-decode steps) left the H200 at
its power cap in 54% of the profile's busy samples, against 96-99% in the live runs at 80% of capacity, and at
a median SM clock of 1.97 GHz against 1.89-1.92 (`nvidia-smi` every 500 ms, docs/executor-performance.md).
"""

from __future__ import annotations

import csv
import datetime
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from executor.model.kv_cache import PagedKVCache, kv_dtype
from executor.model.sampler import SamplingParams
from executor.worker.engine import Engine, Job, build_model, build_runner
from profiles.shapes import Shape
from profiles.store import profile_directory
from runs.tally import Tally, Watcher
from sangam.batcher import Batcher
from sangam.budget import BatchConfig, Policy
from sangam.hardware import BLOCK, kv_pages, lookup_gpu, lookup_model, pages_for
from sangam.kv import PagePool
from sangam.request import Request

PREFILLS = (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
CONTEXTS = (256, 1024, 1819, 3072, 4608)
FILLER = (Shape((1536,), (1819,) * 3), *[Shape((), (1819,) * 4)] * 2)  # about 70% of the time mixed


def grid(capacity: int) -> list[Shape]:
    """Prefill, decode-only (even and skewed contexts) and mixed shapes that fit `capacity` pages."""
    shapes = [Shape((s,), ()) for s in PREFILLS]
    shapes += [Shape((s // 2, s // 2), ()) for s in (1024, 2048, 4096, 8192)] + [Shape((3000, 1000), ())]
    shapes += [Shape((), (c,) * b) for b in BATCHES for c in CONTEXTS]
    shapes += [Shape((), (300, 4000) * (b // 2)) for b in (4, 16, 48)]
    shapes += [Shape((s,), (1819,) * b) for b in (1, 4, 8, 16, 32) for s in (1024, 2048, 4096)]
    # a worker near capacity mixes a prefill with a few decodes of any context: the mixed steps' context terms
    shapes += [Shape((s,), (c,) * b) for s in (1536, 3072) for b in (2, 6) for c in (1024, 3072)]
    shapes += [Shape((s,), (300, 4000) * (b // 2)) for s in (1024, 2048) for b in (2, 4)]
    shapes += [Shape((1819, 1819), (1819,) * b) for b in (4, 16)]
    return [s for s in shapes if sum(pages_for(n) for n in (*s.prefills, *s.decodes)) <= capacity]


class Profiler:
    """One worker's engine parts, reused across grid points."""

    def __init__(
        self,
        model: str,
        weights: str,
        pages: int,
        graphs: bool,
        device: torch.device,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.model = build_model(model, weights, device, seed=0, quantization=quantization)
        self.quantization, self.kv_cache_dtype = quantization, kv_cache_dtype
        self.pool = PagePool(pages)
        dtype = kv_dtype(kv_cache_dtype, self.model.dtype)
        cache = PagedKVCache.for_model(self.pool, self.model.config, dtype=dtype, device=device)
        self.runner = build_runner(self.model, cache, cuda_graphs=graphs)
        self.kv_pages = self.pool.num_free  # what the live worker registers
        self.buckets = tuple(getattr(self.runner, "buckets", ())) if graphs else ()
        self._ids = iter(range(1 << 62))

    def time(self, shape: Shape, warmup: int, repeats: int) -> float:
        """Median seconds of `Engine.step()` on this shape, each step run right after the `FILLER` steps."""
        times = []
        for _ in range(warmup + repeats):
            for other in FILLER:
                self._step(other)
            times.append(self._step(shape))
        return statistics.median(times[warmup:])

    def _step(self, shape: Shape) -> float:
        batcher = Batcher(0, BatchConfig(Policy.PREFILL_FIRST, max_decodes=1 << 10), self.pool)
        engine = Engine(0, self.model, batcher, self.runner)
        for context in shape.decodes:
            job = self._job(context)
            self.pool.allocate(job.req.id, job.req.pages)
            job.req.step = 1
            batcher.add_decode(job.req)
            engine.jobs[job.req.id] = job
        for length in shape.prefills:
            job = self._job(length)
            batcher.add_prefill(job.req)
            engine.jobs[job.req.id] = job
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()  # ends with the committed tokens on the host: synchronised
        seconds = time.perf_counter() - start
        for rid in engine.jobs:
            if self.pool.holds(rid):
                self.pool.release(rid)
        return seconds

    def _job(self, seq_len: int) -> Job:
        """One request whose current block is its last 32 positions, planned to take 32 forwards."""
        rid = next(self._ids)
        config = self.model.config
        tokens = torch.randint(0, config.mask_id, (seq_len,), dtype=torch.long)
        tokens[-BLOCK:] = config.mask_id
        req = Request(rid, 0.0, seq_len - BLOCK, BLOCK, BLOCK, (BLOCK,))
        return Job(req, 0, seq_len - BLOCK, tokens, SamplingParams(seed=rid), BLOCK)


def run_profile(
    model: str,
    gpu: str,
    out: Path,
    *,
    weights: str = "random",
    graphs: bool = True,
    repeats: int = 5,
    watch: Watcher | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
) -> tuple[Path, Path]:
    """Measure the grid on this machine's GPU; write `<out>/<gpu>/<model>.csv` and `.meta.json` (with
    `quantization` or an FP8 KV cache, under `<out>/<profile_directory>/`), the pages in `kv_cache_dtype`.
    `watch` hears the iteration shapes timed of the grid's."""
    started = time.time()
    pages = kv_pages(lookup_model(model), lookup_gpu(gpu), kv_dtype=kv_cache_dtype)
    profiler = Profiler(model, weights, pages, graphs, profile_device(), quantization, kv_cache_dtype)
    shapes = grid(profiler.kv_pages)
    rows: list[tuple[str, float]] = []
    for shape in shapes:
        if watch is not None:
            watch(Tally(len(rows), len(shapes)))
        rows.append((shape.format(), profiler.time(shape, warmup=1, repeats=repeats)))
    data = out / profile_directory(gpu, quantization, kv_cache_dtype) / f"{model}.csv"
    data.parent.mkdir(parents=True, exist_ok=True)
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["items", "seconds"])
        writer.writerows((items, f"{seconds:.6e}") for items, seconds in rows)
    meta = data.with_suffix(".meta.json")
    meta.write_text(
        json.dumps(metadata(model, gpu, weights, profiler, len(shapes), repeats, started), indent=2)
    )
    return data, meta


def profile_device() -> torch.device:
    """The GPU a profile times; ValueError (one line) without one."""
    if not torch.cuda.is_available():
        raise ValueError("sangam profile needs a CUDA GPU")
    return torch.device("cuda")


def metadata(
    model: str, gpu: str, weights: str, profiler: Profiler, points: int, repeats: int, started: float
) -> dict[str, Any]:
    return {
        "model": model,
        "gpu": gpu,
        "device_name": _device_name(profiler.model.device),
        "weights": weights,
        "quantization": profiler.quantization,
        "kv_cache_dtype": profiler.kv_cache_dtype,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "flashinfer": _version("flashinfer"),
        "python": platform.python_version(),
        "code_version": _code_version(),
        "date": datetime.datetime.fromtimestamp(started, datetime.UTC).isoformat(timespec="seconds"),
        "grid": {"points": points, "prefills": PREFILLS, "batches": BATCHES, "contexts": CONTEXTS},
        "timing": f"median of {repeats} Engine.step() wall times after 1 warm-up, each after the filler",
        "filler": [shape.format() for shape in FILLER],
        "kv_pages": profiler.kv_pages,  # of `kv_cache_dtype`
        "graph_buckets": list(profiler.buckets),
        "measured_seconds": round(time.time() - started, 1),
    }


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _version(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return None


def _code_version() -> str:
    """The package version and a hash of the worker's sources: what a profile is only valid for."""
    import hashlib

    from sangam import __version__

    root = Path(__file__).parent.parent
    digest = hashlib.sha256()
    for path in sorted([*root.glob("executor/**/*.py"), *root.glob("sangam/*.py")]):
        digest.update(path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"
