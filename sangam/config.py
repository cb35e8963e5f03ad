"""One run's configuration, shared by `sangam sim` and `sangam live`, and the requests it makes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sangam.batcher import BatchConfig, Policy
from sangam.hardware import ModelSpec, kv_pages, lookup_gpu, lookup_model
from sangam.layout import Layout, parse_mode
from sangam.progress import ProgressModel, default_progress
from sangam.request import Request
from sangam.workload import MASK_LEN, TraceRow, check_arrival_cv, sample_lengths, with_arrivals

DATASETS = tuple(MASK_LEN)
# The live control plane's delay on a dispatch, which the simulator charges: the median from a block's end
# to its re-prefill starting on an idle worker (report, routing, dispatch, pick-up) was 2.7-2.9 ms over
# 2,458 such blocks of `sangam live --mode colocated`, LLaDA-8B on one H200 (a fresh arrival: about 2 ms).
CONTROL_MS = 2.8


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything that decides a run; defaults are the paper's (docs/design.md section 6)."""

    mode: str = "colocated"
    model: str = "llada-8b"
    gpu: str = "h100"
    gpus: int = 8  # workers for plain `colocated`
    trace: str = "sharegpt"  # a synthetic dataset name or a trace file
    qps: float = 7.5
    num_requests: int = 4000
    arrival_cv: float | None = None  # None: Poisson; else gamma gaps with this CV
    mask_len: int | None = None  # None: the dataset's (1024 ShareGPT, 512 arXiv)
    budget: int = 1024  # tau of colocated and decode-role workers
    prefill_budget: int = 2048  # tau of prefill-role workers
    theta: int = 8192  # hybrid overflow threshold, outstanding prefill tokens
    policy: Policy = Policy.DEFICIT
    max_decodes: int = 64
    pages: int | None = None  # KV pages per worker; None: from GPU memory minus weights
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("gpus", "num_requests", "budget", "prefill_budget", "theta", "max_decodes"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}"
                )
        if not self.qps > 0:
            raise ValueError(f"qps must be positive, got {self.qps}")
        check_arrival_cv(self.arrival_cv)
        if self.mask_len is not None and (self.mask_len <= 0 or self.mask_len % 32):
            raise ValueError(f"mask length must be a positive multiple of 32, got {self.mask_len}")
        if self.pages is not None and self.pages <= 0:
            raise ValueError(f"pages must be a positive integer, got {self.pages}")
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
        return self.pages if self.pages is not None else kv_pages(self.model_spec, lookup_gpu(self.gpu))

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
        """The config with every default made explicit, for summary.json."""
        out = dataclasses.asdict(self)
        out.update(layout=self.layout.name, kv_pages=self.kv_pages, mask_len=self.mask_tokens)
        return out


def synthetic_rows(cfg: RunConfig) -> list[TraceRow]:
    """The configured synthetic trace; lengths and arrival gaps come from separate streams,
    so that the same seed gives the same requests at every rate."""
    rows = [TraceRow(p, o) for p, o in sample_lengths(cfg.trace, cfg.num_requests, cfg.rng("lengths"))]
    return with_arrival_times(cfg, rows)


def with_arrival_times(cfg: RunConfig, rows: Sequence[TraceRow]) -> list[TraceRow]:
    """Rows with every missing arrival time drawn from the configured arrival process."""
    return with_arrivals(rows, cfg.qps, cfg.rng("arrivals"), cfg.arrival_cv)


def build_requests(
    cfg: RunConfig, rows: Sequence[TraceRow], progress: ProgressModel | None = None
) -> list[Request]:
    """Requests with every block's forwards fixed up front (the trace's, else drawn)."""
    progress = progress or default_progress(cfg.model, cfg.trace if cfg.is_synthetic else "sharegpt")
    rng = cfg.rng("progress")
    pages = cfg.kv_pages
    requests = []
    for i, row in enumerate(rows):
        assert row.arrival_time is not None
        n_blocks = -(-row.output_len // 32)
        steps = row.steps if row.steps is not None else progress.plan(n_blocks, rng)
        if row.output_len > cfg.mask_tokens:
            raise ValueError(
                f"request {i}: {row.output_len} output tokens do not fit the {cfg.mask_tokens}-token mask"
                " buffer (raise --mask-len)"
            )
        req = Request(i, row.arrival_time, row.prompt_len, row.output_len, cfg.mask_tokens, steps)
        if req.pages > pages:
            raise ValueError(
                f"request {i}: {req.seq_len} tokens need {req.pages} KV pages, a worker holds {pages}"
            )
        requests.append(req)
    return requests
