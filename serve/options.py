"""The options of `sangam serve` beyond `sangam live`'s (stdlib and `sangam` only: the command line is
built without FastAPI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runs.args import port_number, positive_float, positive_int
from runs.options import nonempty_path, option


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """The HTTP side of `sangam serve`. (The scheduler's gRPC client port is not exposed: it binds any
    free loopback port, so `--host`/`--port` here are the HTTP server's alone.)"""

    host: str = option("127.0.0.1", "address the HTTP server binds")
    port: int = option(8000, "HTTP port (0: any free one)", parse=port_number)
    tokenizer: Path | None = option(
        None, "Hugging Face tokenizer directory (read with transformers' AutoTokenizer)", parse=nonempty_path,
        metavar="DIR", default_text="the --weights checkpoint's, else the built-in BPE",
    )  # fmt: skip
    max_waiting: int = option(
        256, "requests queued at the scheduler beyond which new ones get 429", parse=positive_int
    )
    drain_timeout: float = option(
        30.0,
        "on SIGTERM, seconds the drain may take: running requests finish or are cut, then the processes stop",
        parse=positive_float,
    )
    served_model_name: tuple[str, ...] = option(
        (), "the names a request's model may give (vLLM's flag; several allowed; the first is reported)",
        many=True, metavar="NAME", default_text="the --model name",
    )  # fmt: skip
    header_timeout: float = option(
        10.0, "seconds a request's headers may take to arrive, from the connection's start or the request's "
        "first byte (then 408 and the connection closes)", parse=positive_float,
    )  # fmt: skip
    body_timeout: float = option(
        30.0, "seconds a request's body may take to arrive after its headers (then 408 and the connection "
        "closes)", parse=positive_float,
    )  # fmt: skip
    keep_alive_timeout: float = option(
        5.0, "seconds an idle connection stays open between requests", parse=positive_float
    )
