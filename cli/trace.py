"""`sangam trace`: write a synthetic trace file (`-o -`: to stdout). Also the checks of `--trace` that
`sangam sim`, `sweep` and `search` share: a misspelt synthetic trace's close match, and a rate given for
a trace with its own arrival times."""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path
from typing import Any

from runs.config import DATASETS, RunConfig
from runs.options import add_options, collect

TRACE_SUFFIXES = (".csv", ".jsonl", ".json")  # what runs.traces reads


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="write a synthetic trace file (arrival_time, prompt_len, output_len)"
    )
    add_options(
        parser, RunConfig, only=("trace", "num_requests", "arrival_cv", "seed"),
        defaults={"num_requests": 20000},
    )  # fmt: skip
    parser.add_argument(
        "--qps", "--request-rate", type=one_rate, default=RunConfig().qps,
        help=f"arrival rate, requests/s: one value, one trace (default: {RunConfig().qps:g})",
    )  # fmt: skip
    parser.add_argument("--dataset", dest="trace", help=argparse.SUPPRESS)  # the old name of --trace
    parser.add_argument(
        "-o", "--output", type=Path, required=True, help="the .csv or .jsonl file to write; - for stdout"
    )


def run(args: argparse.Namespace) -> int:
    from runs.config import synthetic_rows
    from runs.traces import write_trace

    cfg = collect(RunConfig, args)
    if not cfg.is_synthetic:
        check_trace_name(cfg.trace)
        raise ValueError(f"--trace {cfg.trace}: a synthetic trace is one of {', '.join(DATASETS)}")
    rows = synthetic_rows(cfg)
    if str(args.output) == "-":
        with tempfile.TemporaryDirectory() as tmp:  # the file's own writer, byte for byte
            path = Path(tmp) / "trace.csv"
            write_trace(path, rows)
            sys.stdout.write(path.read_text(encoding="utf-8"))
        print(f"wrote {len(rows)} requests to stdout", file=sys.stderr)
        return 0
    write_trace(args.output, rows)
    print(f"wrote {len(rows)} requests to {args.output}")
    return 0


def one_rate(text: str) -> float:
    from runs.config import qps_list

    rates = qps_list(text)
    if len(rates) != 1:
        raise argparse.ArgumentTypeError(f"{text}: a trace has one rate; run sangam trace once per rate")
    return rates[0]


def check_trace_name(trace: str) -> None:
    """Refuse a `--trace` that is neither a synthetic trace nor a trace file's name, with the closest
    synthetic trace's name if one is close (`sharegtp`: sharegpt)."""
    if trace in DATASETS or Path(trace).suffix.lower() in TRACE_SUFFIXES:
        return
    close = difflib.get_close_matches(trace.lower(), DATASETS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ValueError(
        f"--trace {trace}: unknown trace; {hint}(synthetic: {', '.join(DATASETS)}; or a "
        f"{'/'.join(TRACE_SUFFIXES)} file)"
    )


def refuse_rate_of_timed_trace(trace: str, given: Any) -> None:
    """A rate given explicitly (`given`: the parsed --qps, None when absent) for a trace file whose rows
    all have an arrival time would be ignored: refuse it, naming the trace's own rate."""
    from runs.config import trace_rate
    from runs.traces import read_trace

    if given is None or trace in DATASETS:
        return
    rows = read_trace(Path(trace))
    if not rows or rows[0].arrival_time is None:
        return  # no times: the rate draws them
    values = given if isinstance(given, list | tuple) else [given]
    rates = " ".join(f"{q:g}" for v in values for q in (v if isinstance(v, list | tuple) else [v]))
    raise ValueError(
        f"--qps {rates}: {trace}: every row has an arrival_time ({trace_rate(rows, 0.0):g} requests/s), "
        "replayed as they are; leave out --qps, or drop the arrival_time column to draw arrivals at a rate"
    )
