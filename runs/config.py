"""One run's configuration, shared by `sangam sim` and `sangam live`, and the requests it makes."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runs.args import MAX_INT, positive_float, positive_int
from runs.options import nonempty_path, option
from sangam.budget import BatchConfig, Policy
from sangam.hardware import GPUS, KV_DTYPE_BYTES, MODELS, ModelSpec, kv_pages, lookup_gpu, lookup_model
from sangam.layout import Layout, parse_mode
from sangam.progress import ProgressModel, default_progress
from sangam.request import Request, response_region
from sangam.workload import (
    MASK_LEN,
    TraceRow,
    check_arrival_clip,
    check_arrival_cv,
    sample_lengths,
    with_arrivals,
)

DATASETS = tuple(MASK_LEN)
MIN_QPS = 1e-6  # a request every 11.6 days
# The live control plane's delay on a dispatch, which the simulator charges: the median from a block's end
# to its re-prefill starting on an idle worker (report, routing, dispatch, pick-up) was 2.7-2.9 ms over
# 2,458 such blocks of `sangam live --mode colocated`, LLaDA-8B on one H200 (a fresh arrival: about 2 ms).
CONTROL_MS = 2.8
MAX_REQUESTS = 1_000_000  # per point: far past what a run needs to be steady, short of filling memory


def qps_list(text: str) -> list[float]:
    """`6,6.5,7`: one or more arrival rates (an empty one, as in `6,,7` or ``, is refused)."""
    return [positive_float(part) for part in text.split(",")]


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything that decides a run; defaults are the paper's (docs/design.md section 6). Each field is
    also the command-line option of `sangam sim` and `sangam live` (`runs.options`)."""

    mode: str = option(
        "colocated", "layout: colocated (every --gpus worker), <n>C, <n>P<m>D (disaggregated) or <n>P<m>C "
        "(hybrid); workers 0..n-1 are the prefill pool"
    )  # fmt: skip
    model: str = option("llada-8b", "modelled model", choices=MODELS)
    gpu: str = option("h100", "GPU whose iteration times and memory are modelled", choices=GPUS)
    gpus: int = option(8, "workers of plain 'colocated'", parse=positive_int)
    trace: str = option("sharegpt", "sharegpt, arxiv (synthetic, the paper's Table 1) or a .csv/.jsonl file")
    qps: float = option(
        7.5, "arrival rate, requests/s; several points: --qps 6 6.5 7 or 6,6.5,7", parse=qps_list,
        aliases=("--request-rate",), many=True,
    )  # fmt: skip
    num_requests: int = option(
        4000, "requests per point (the first N rows of a trace file)", parse=positive_int,
        aliases=("--num-prompts", "-n"),
    )  # fmt: skip
    arrival_cv: float | None = option(
        None, "gamma inter-arrival gaps with this coefficient of variation", parse=positive_float,
        default_text="Poisson",
    )  # fmt: skip
    arrival_clip: float | None = option(
        None, "clip exponential gaps at this many mean gaps (the reference harness: 3, a rate 5.2%% above "
        "--qps)", parse=positive_float, default_text="no clip",
    )  # fmt: skip
    mask_len: int | None = option(
        None, "mask buffer in tokens, a multiple of 32: every request's, or the largest allowed where a "
        "request sizes its own (a trace's max_tokens column, serve's max_tokens)", parse=positive_int,
        default_text="1024 for ShareGPT and trace files, 512 for arXiv",
    )  # fmt: skip
    budget: int = option(1024, "tau: token budget per iteration of colocated and decode-role workers",
                         parse=positive_int)  # fmt: skip
    prefill_budget: int = option(2048, "tau of prefill-role workers", parse=positive_int)
    theta: int = option(8192, "hybrid overflow threshold, outstanding prefill tokens", parse=positive_int)
    policy: Policy = option(
        Policy.DEFICIT, "deficit (Algorithm 1), prefill-first (tau = infinity) or fastdllm (one request at a "
        "time per worker)"
    )  # fmt: skip
    max_decodes: int = option(64, "decodes seated per iteration at most", parse=positive_int)
    pages: int | None = option(
        None, "KV pages (16 tokens each) per worker", parse=positive_int,
        default_text="the measured profile's, else 90% of GPU memory minus weights minus 8 GiB",
    )  # fmt: skip
    kv_cache_dtype: str = option(
        "auto", "KV cache storage (vLLM's flag): auto keeps the model's dtype (bf16 on GPU); fp8 stores E4M3 "
        "with a per-tensor scale of 1.0, so the same memory holds twice the pages and a KV transfer moves "
        "half the bytes", choices=tuple(KV_DTYPE_BYTES),
    )  # fmt: skip
    seed: int = option(0, "seeds every random stream: lengths, arrivals, forwards per block, tie-breaks",
                       parse=int)  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("gpus", "num_requests", "budget", "prefill_budget", "theta", "max_decodes"):
            if not 0 < getattr(self, name) <= MAX_INT:
                raise ValueError(
                    f"{name.replace('_', '-')} must be a positive integer up to {MAX_INT}, "
                    f"got {getattr(self, name)}"
                )
        if self.num_requests > MAX_REQUESTS:
            raise ValueError(f"num-requests must be at most {MAX_REQUESTS}, got {self.num_requests}")
        if not MIN_QPS <= self.qps < math.inf:  # 1e-320 made every arrival gap infinite
            raise ValueError(f"qps must be a finite rate of at least {MIN_QPS:g}, got {self.qps}")
        check_arrival_cv(self.arrival_cv)
        check_arrival_clip(self.arrival_clip)
        if self.arrival_clip is not None and self.arrival_cv is not None:
            raise ValueError("--arrival-clip applies to Poisson gaps only, not with --arrival-cv")
        if self.mask_len is not None and not (0 < self.mask_len <= MAX_INT and self.mask_len % 32 == 0):
            raise ValueError(
                f"mask length must be a positive multiple of 32 up to {MAX_INT}, got {self.mask_len}"
            )
        if self.pages is not None and not 0 < self.pages <= MAX_INT:
            raise ValueError(f"pages must be a positive integer up to {MAX_INT}, got {self.pages}")
        if self.kv_cache_dtype not in KV_DTYPE_BYTES:
            raise ValueError(
                f"kv-cache-dtype must be one of {', '.join(KV_DTYPE_BYTES)}, got {self.kv_cache_dtype!r}"
            )
        self.layout  # noqa: B018 - validates the mode string
        lookup_model(self.model)
        lookup_gpu(self.gpu)

    @property
    def layout(self) -> Layout:
        return parse_mode(self.mode, self.gpus)

    @property
    def model_spec(self) -> ModelSpec:
        return lookup_model(self.model)

    @property
    def is_synthetic(self) -> bool:
        return self.trace in DATASETS

    @property
    def kv_pages(self) -> int:
        if self.pages is not None:
            return self.pages
        return kv_pages(self.model_spec, lookup_gpu(self.gpu), kv_dtype=self.kv_cache_dtype)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one position as this run stores (and transfers) them."""
        return self.model_spec.kv_bytes_per_token(self.kv_cache_dtype)

    @property
    def mask_tokens(self) -> int:
        if self.mask_len is not None:
            return self.mask_len
        return MASK_LEN[self.trace] if self.is_synthetic else MASK_LEN["sharegpt"]

    def batch_config(self) -> BatchConfig:
        return BatchConfig(self.policy, self.budget, self.max_decodes)

    def prefill_batch_config(self) -> BatchConfig:
        return BatchConfig(self.policy, self.prefill_budget, self.max_decodes)

    def rng(self, stream: str) -> random.Random:
        """An independent generator per stream, so that e.g. lengths do not change with QPS."""
        return random.Random(f"{self.seed}:{stream}")

    def resolved(self) -> dict[str, Any]:
        """The config with every default made explicit, for summary.json, one name per fact: `layout`
        (the mode's canonical name: `8C` for `colocated` on 8 GPUs) for `mode`, `kv_pages` (the pages a
        worker holds, given or from GPU memory) for `pages`. `from_resolved` reads it back."""
        out = dataclasses.asdict(self)
        del out["mode"], out["pages"]
        out.update(layout=self.layout.name, kv_pages=self.kv_pages, mask_len=self.mask_tokens)
        return out

    @classmethod
    def from_resolved(cls, values: Mapping[str, Any], **changes: Any) -> RunConfig:
        """The config a summary.json's `resolved()` config names (files that still hold `mode` and
        `pages`, written before one name per fact, are read too), with `changes`; TypeError or
        ValueError if it is not one."""
        fields = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in values.items() if k in fields}
        if "layout" in values:
            given["mode"] = values["layout"]
        if "model_spec" in values:  # a server's summary: `model` is what served, `model_spec` its shapes
            given["model"] = values["model_spec"]
        if given.get("pages") is None and values.get("kv_pages") is not None:
            given["pages"] = values["kv_pages"]
        for name in _NULL_WHERE_UNUSED:
            if given.get(name, 0) is None:
                del given[name]
        for name, value in given.items():
            source = _RESOLVED_NAMES.get(name, name)  # the file's name for the value
            _check_type(source if source in values else name, value, _FIELD_TYPES[name])
        if isinstance(given.get("policy"), str):
            given["policy"] = Policy(given["policy"])
        return cls(**{**given, **changes})


# what a summary.json may hold for each field, by its annotation (JSON has no enums: a policy is its name)
_JSON_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "None": (type(None),), "Policy": (str,)}
_RESOLVED_NAMES = {"mode": "layout", "model": "model_spec", "pages": "kv_pages"}
_NULL_WHERE_UNUSED = ("prefill_budget", "theta")  # a server's summary: null where its layout has no use
_FIELD_TYPES = {
    field.name: tuple(kind for part in str(field.type).split("|") for kind in _JSON_TYPES[part.strip()])
    for field in dataclasses.fields(RunConfig)
}


def _check_type(name: str, value: Any, kinds: tuple[type, ...]) -> None:
    """TypeError unless `value` is one of `kinds` (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise TypeError(f"{name} must be {wanted}, got {value!r}")


def synthetic_rows(cfg: RunConfig) -> list[TraceRow]:
    """The configured synthetic trace; lengths and arrival gaps come from separate streams,
    so that the same seed gives the same requests at every rate."""
    rows = [TraceRow(p, o) for p, o in sample_lengths(cfg.trace, cfg.num_requests, cfg.rng("lengths"))]
    return with_arrival_times(cfg, rows)


def with_arrival_times(cfg: RunConfig, rows: Sequence[TraceRow]) -> list[TraceRow]:
    """Rows with every missing arrival time drawn from the configured arrival process."""
    return with_arrivals(rows, cfg.qps, cfg.rng("arrivals"), cfg.arrival_cv, cfg.arrival_clip)


def build_requests(
    cfg: RunConfig, rows: Sequence[TraceRow], progress: ProgressModel | None = None
) -> list[Request]:
    """Requests with every block's forwards fixed up front (the trace's, else drawn), each with its mask
    buffer (`mask_len_of`)."""
    progress = progress or default_progress(cfg.model, cfg.trace if cfg.is_synthetic else "sharegpt")
    rng = cfg.rng("progress")
    pages = cfg.kv_pages
    requests = []
    for i, row in enumerate(rows):
        assert row.arrival_time is not None
        n_blocks = -(-row.output_len // 32)
        steps = row.steps if row.steps is not None else progress.plan(n_blocks, rng)
        req = Request(i, row.arrival_time, row.prompt_len, row.output_len, mask_len_of(cfg, row, i), steps)
        if req.pages > pages:
            raise ValueError(
                f"request {i}: {req.seq_len} tokens need {req.pages} KV pages, a worker holds {pages}"
            )
        requests.append(req)
    return requests


def mask_len_of(cfg: RunConfig, row: TraceRow, index: int) -> int:
    """Request `index`'s mask buffer, in a simulated and a live run alike: its `max_tokens` rounded up to
    whole blocks when the trace gives one, else the fixed `--mask-len`, which is also the largest allowed;
    ValueError (one line) if the request does not fit it."""
    if row.max_tokens is None:
        if row.output_len > cfg.mask_tokens:
            raise ValueError(
                f"request {index}: {row.output_len} output tokens do not fit the {cfg.mask_tokens}-token "
                "mask buffer (raise --mask-len)"
            )
        return cfg.mask_tokens
    mask_len = response_region(row.max_tokens)
    if mask_len > cfg.mask_tokens:
        raise ValueError(
            f"request {index}: max_tokens {row.max_tokens} needs a {mask_len}-token mask buffer, beyond "
            f"--mask-len {cfg.mask_tokens} (raise --mask-len)"
        )
    return mask_len


@dataclass(frozen=True, slots=True)
class RunFiles:
    """What a run reads besides its config, and writes."""

    progress: str | None = option(
        None, "forwards per block: fixed:D, uniform:LO:HI, betabinom:MEAN:STD, counts:D=N,... or "
        "empirical:FILE",
        default_text="fitted per model and trace",
    )  # fmt: skip
    out: Path | None = option(
        None, "write requests.csv, blocks.csv and summary.json here (DIR/qps-Q/ per point when several)",
        parse=nonempty_path, aliases=("--result-dir",), metavar="DIR",
    )  # fmt: skip
    iteration_log: Path | None = option(
        None, "write one CSV row per worker iteration (FILE-qpsQ.csv per point when several)",
        parse=nonempty_path, metavar="FILE",
    )  # fmt: skip


def load_progress(spec: str | None) -> ProgressModel | None:
    """The `--progress` model (None: the default per model and trace)."""
    if not spec:
        return None
    from runs.traces import read_steps
    from sangam.progress import empirical, parse_progress

    kind, _, path = spec.partition(":")
    if kind == "empirical" and not path:
        raise ValueError("empirical progress needs a file: empirical:FILE")
    return empirical(read_steps(Path(path))) if kind == "empirical" else parse_progress(spec)


def workload_points(base: RunConfig, rates: Sequence[float]) -> list[tuple[RunConfig, list[TraceRow]]]:
    """Each rate's config and requests. A trace file's own arrival times replace the rates: its config then
    records the trace's rate, and several rates or an arrival CV are refused (they would be ignored). The
    config counts the requests the trace held when it is shorter than `num_requests`."""
    if base.is_synthetic:
        configs = [dataclasses.replace(base, qps=q) for q in rates]
        return [(cfg, synthetic_rows(cfg)) for cfg in configs]
    from runs.traces import read_trace

    rows = read_trace(Path(base.trace))[: base.num_requests]
    base = dataclasses.replace(base, num_requests=len(rows))
    if rows[0].arrival_time is None:
        configs = [dataclasses.replace(base, qps=q) for q in rates]
        return [(cfg, with_arrival_times(cfg, rows)) for cfg in configs]
    if len(rates) > 1:
        raise ValueError(
            f"{base.trace}: every row has an arrival_time, so each --qps point would replay the same "
            "arrivals; give one rate"
        )
    if base.arrival_cv is not None:
        raise ValueError(f"{base.trace}: every row has an arrival_time, so --arrival-cv would be ignored")
    return [(dataclasses.replace(base, qps=trace_rate(rows, base.qps)), rows)]


def trace_rate(rows: Sequence[TraceRow], fallback: float) -> float:
    """The mean arrival rate of timed rows, requests/s (`fallback` when their times span no time)."""
    times = [r.arrival_time for r in rows if r.arrival_time is not None]
    span = max(times) - min(times)
    return float(f"{(len(times) - 1) / span:.4g}") if len(times) > 1 and span > 0 else fallback
