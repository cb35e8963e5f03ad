"""The options of `sangam live` beyond the run's config: processes, KV transfer, unmasking.

Imports only the standard library and `sangam`, so the command line is built without torch or grpc.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from executor.model.live_models import LIVE_MODELS
from runs.args import non_negative_float, non_negative_int, port_number, positive_float, positive_int
from runs.options import nonempty_path, option

KV_TRANSPORTS = ("gloo", "nccl")  # executor.transfer.links.TRANSPORTS, without importing torch here
QUANTIZATIONS = ("fp8",)  # executor.model.fp8.QUANTIZATIONS, likewise
SERVE_PORT = 50051
LIVE_NUM_REQUESTS = 100
CPU_NUM_REQUESTS = 16  # full-length ShareGPT sequences on the tiny CPU model: about 20 s on 2 cores
API_KEY_ENV = "SANGAM_API_KEY"  # the api key when --api-key is absent (as vLLM's VLLM_API_KEY)


def threshold(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a threshold in (0, 1], got {text!r}")
    return value


def gpu_list(text: str) -> tuple[int, ...]:
    """`N` (the first N visible GPUs) or a comma list of indices `0,2,3`; a repeated index (`0,0`) puts
    several workers on one GPU."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a GPU count or a list like 0,1,3, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected a GPU count or a list like 0,1,3, got {text!r}")
    if len(values) == 1 and "," not in text:
        if values[0] == 0:
            raise argparse.ArgumentTypeError("--gpus needs at least one GPU")
        return tuple(range(values[0]))
    return tuple(values)


@dataclass(frozen=True, slots=True)
class LiveOptions:
    """How `sangam live` runs its processes."""

    gpus: tuple[int, ...] | None = option(
        None, "GPU count or indices, one worker each; 0,0 puts two workers on GPU 0", parse=gpu_list,
        default_text="every visible GPU",
    )  # fmt: skip
    workers: int | None = option(None, "run N CPU workers instead (no GPU needed)", parse=positive_int)
    model: str | None = option(
        None, "served model; ignored with --weights DIR", choices=sorted(LIVE_MODELS),
        default_text="llada-8b on GPU, tiny-llada on CPU",
    )  # fmt: skip
    weights: str = option("random", "'random' or a local Hugging Face checkpoint directory")
    trust_remote_code: bool = option(
        False, "run code shipped with a checkpoint where it needs it (vLLM's flag): Dream's tokenizer is its "
        "own tokenization_dream.py; the models themselves are always Sangam's",
    )  # fmt: skip
    max_model_len: int | None = option(
        None, "context window in tokens, prompt and mask buffer together (vLLM's flag); a longer request is "
        "refused (HTTP 400)", parse=positive_int, metavar="N",
        default_text="what the model documents: LLaDA 4096, Dream 2048",
    )  # fmt: skip
    threads: int = option(1, "torch CPU threads per worker", parse=positive_int)
    cuda_graphs: bool = option(
        True, "replay decode-only iterations (and FP8 models' other bodies, in pieces) from CUDA graphs"
    )
    quantization: str | None = option(
        None, "quantize the linear layers at load (vLLM's flag): fp8 stores q/k/v/o and MLP weights in "
        "FP8 E4M3 with per-output-channel scales and quantizes activations per token, on Hopper's FP8 GEMMs "
        "(on CPU a dequantizing reference path); the LM head, embeddings and norms stay bf16",
        choices=QUANTIZATIONS, default_text="none: bf16 weights",
    )  # fmt: skip
    host: str = option("127.0.0.1", "address the scheduler's client port binds")
    port: int | None = option(
        None, "client port (0: any free one)", parse=port_number,
        default_text=f"{SERVE_PORT} with --serve, else any free one",
    )  # fmt: skip
    serve: bool = option(
        False, "serve external clients (executor/control/client.py) until Ctrl-C instead of a replay"
    )
    api_key: str | None = option(
        None, "every call on the client port needs metadata 'authorization: Bearer KEY' "
        "(SangamClient(..., api_key=KEY)); grpc.health.v1 stays open for probes", metavar="KEY",
        default_text=f"${API_KEY_ENV} if set, else none: the client port is open",
    )  # fmt: skip
    log_dir: Path | None = option(
        None,
        "process logs",
        parse=nonempty_path,
        metavar="DIR",
        default_text="a temporary directory, kept on failure",
    )
    startup_timeout: float = option(600.0, "seconds for every worker to register", parse=positive_float)
    stall_timeout: float = option(
        300.0, "fail after this many seconds without progress", parse=positive_float
    )
    kv_transport: str = option(
        "auto", "KV transport of <n>P<m>D and <n>P<m>C: auto is gloo on CPU and on a shared GPU (through "
        "pinned host memory), nccl between distinct GPUs", choices=("auto", *KV_TRANSPORTS),
    )  # fmt: skip
    transfer_timeout: float = option(30.0, "seconds per KV transfer attempt", parse=positive_float)
    transfer_attempts: int = option(3, "attempts per KV transfer before the request ends ERROR",
                                    parse=positive_int)  # fmt: skip
    restart_workers: bool = option(
        False, "start a new process for a worker that died (or was declared lost) on its device; it "
        "registers again and takes work",
    )  # fmt: skip
    restart_limit: int = option(
        5, "with --restart-workers: restarts of a worker in a row, each dead within 60 s of its start, "
        "before it is given up (the waits: 1 s, then twice the last, at most 30 s)", parse=non_negative_int,
    )  # fmt: skip
    worker_timeout: float = option(
        30.0, "declare a worker lost after this many seconds without a report while it holds work",
        parse=positive_float,
    )  # fmt: skip
    dist_timeout: float = option(
        120.0, "seconds for the KV rendezvous at start-up and for rebuilding a link", parse=positive_float
    )
    unmask: str | None = option(
        None, "schedule: each block takes the progress model's forwards; threshold: commit by confidence",
        choices=("schedule", "threshold"), default_text="schedule with random weights, else threshold",
    )  # fmt: skip
    threshold: float = option(0.9, "confidence threshold of --unmask threshold", parse=threshold)
    temperature: float = option(0.0, "sampling temperature (0: greedy)", parse=non_negative_float)


def with_env_api_key(options: LiveOptions, environ: Mapping[str, str]) -> LiveOptions:
    """`options` with the api key of `environ` (`SANGAM_API_KEY`) when `--api-key` was not given;
    ValueError for an empty `--api-key`."""
    if options.api_key is not None:
        if not options.api_key:
            raise ValueError("--api-key must not be empty")
        return options
    return replace(options, api_key=environ.get(API_KEY_ENV) or None)
