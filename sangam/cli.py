"""`sangam` command line: `sim`, `live`, `app`, `profile`, `validate` and `trace`; drivers load lazily."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sangam.args import non_negative_float, positive_float, positive_int
from sangam.batcher import Policy
from sangam.config import CONTROL_MS, RunConfig

DEFAULTS = RunConfig()


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit status 2."""


def qps_list(text: str) -> list[float]:
    return [positive_float(part) for part in text.split(",") if part]


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sangam", description="Serve and simulate cached diffusion LLMs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    sim = commands.add_parser("sim", help="simulate a layout on a workload (SimPy, profiled iteration times)")
    sim.add_argument("--mode", default=DEFAULTS.mode, help="colocated, <n>C, <n>P<m>D or <n>P<m>C")
    sim.add_argument("--model", default=DEFAULTS.model, help="llada-8b or dream-7b")
    sim.add_argument("--gpu", default=DEFAULTS.gpu, help="h100 or h200")
    sim.add_argument("--gpus", type=positive_int, default=DEFAULTS.gpus, help="workers of plain 'colocated'")
    sim.add_argument("--trace", default=DEFAULTS.trace, help="sharegpt, arxiv, or a .csv/.jsonl trace file")
    sim.add_argument(
        "--qps", type=qps_list, nargs="+", default=[[DEFAULTS.qps]], help="one or more rates (space or comma)"
    )
    sim.add_argument("--num-requests", type=positive_int, default=DEFAULTS.num_requests)
    sim.add_argument(
        "--arrival-cv", type=positive_float, help="gamma arrivals with this CV (default Poisson)"
    )
    sim.add_argument("--mask-len", type=positive_int, help="mask buffer (default 1024 ShareGPT, 512 arXiv)")
    sim.add_argument("--budget", type=positive_int, default=DEFAULTS.budget, help="tau of colocated workers")
    sim.add_argument("--prefill-budget", type=positive_int, default=DEFAULTS.prefill_budget)
    sim.add_argument("--theta", type=positive_int, default=DEFAULTS.theta, help="hybrid overflow threshold")
    sim.add_argument("--policy", choices=[p.value for p in Policy], default=DEFAULTS.policy.value)
    sim.add_argument("--max-decodes", type=positive_int, default=DEFAULTS.max_decodes)
    sim.add_argument("--pages", type=positive_int, help="KV pages per worker (default: from GPU memory)")
    sim.add_argument(
        "--progress", help="forwards per block: fixed:D, uniform:LO:HI, betabinom:MEAN:STD, empirical:FILE"
    )
    sim.add_argument("--link-gbps", type=positive_float, default=100.0, help="KV link bandwidth, GB/s")
    sim.add_argument("--link-latency-ms", type=non_negative_float, default=1.0, help="KV link latency, ms")
    sim.add_argument(
        "--link",
        help="measured KV link profile: a name in profiles/data/links or a JSON file (replaces --link-gbps "
        "and --link-latency-ms)",
    )
    sim.add_argument(
        "--control-ms",
        type=non_negative_float,
        default=CONTROL_MS,
        help="control-plane delay on every dispatch, ms (default %(default)s, as measured live on an H200)",
    )
    sim.add_argument("--seed", type=int, default=DEFAULTS.seed)
    sim.add_argument(
        "--cost",
        choices=["profile", "analytic"],
        default="profile",
        help="iteration times: the measured (or derived) profile of --model on --gpu, else analytic",
    )
    sim.add_argument("--out", type=Path, help="write requests.csv, blocks.csv and summary.json here")
    sim.add_argument("--iteration-log", type=Path, help="write one CSV row per worker iteration")

    live = commands.add_parser("live", help="serve live: a scheduler process and one worker process per GPU")
    from executor.live import add_live_arguments

    add_live_arguments(live)

    profile = commands.add_parser(
        "profile", help="measure iteration times of our worker on this GPU and fit them"
    )
    profile.add_argument("--model", default="llada-8b", help="llada-8b or dream-7b")
    profile.add_argument("--gpu", default="h200", help="the GPU being profiled (names the data file)")
    profile.add_argument("--weights", default="random", help="'random' or a local HF checkpoint directory")
    profile.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    profile.add_argument("--repeats", type=positive_int, default=5)
    profile.add_argument("--from-log", type=Path, nargs="+", help="refit from live iteration logs instead")
    profile.add_argument("--out", type=Path, help="profile data root (default: the shipped profiles/data)")

    validate = commands.add_parser("validate", help="run one trace live and simulated; report the errors")
    validate.add_argument("--mode", default="colocated")
    validate.add_argument("--model", default="llada-8b")
    validate.add_argument("--gpu", default="h200")
    validate.add_argument("--gpus", type=positive_int, default=1)
    validate.add_argument("--num-requests", type=positive_int, default=300)
    validate.add_argument(
        "--qps", type=positive_float, nargs="+", help="loads (default: 30/60/90%% of the knee)"
    )
    validate.add_argument("--seed", type=int, default=DEFAULTS.seed)
    validate.add_argument("--out", type=Path, default=Path("results/validate"), help="run directories")
    validate.add_argument(
        "--live-results", type=Path, help="compare with the live runs already in this directory (live-qpsQ/)"
    )
    validate.add_argument("--report", type=Path, help="report JSON (default: benchmarks/results/...)")
    validate.add_argument("--link", help="the simulator's KV link profile (disaggregated and hybrid modes)")

    explorer = commands.add_parser("app", help="open the what-if explorer (Streamlit) on 127.0.0.1")
    from app.launch import add_app_arguments

    add_app_arguments(explorer)

    trace = commands.add_parser("trace", help="write a synthetic trace file")
    trace.add_argument("--dataset", choices=["sharegpt", "arxiv"], default="sharegpt")
    trace.add_argument("-n", "--num-requests", type=positive_int, default=20000)
    trace.add_argument("--qps", type=positive_float, default=DEFAULTS.qps)
    trace.add_argument("--seed", type=int, default=DEFAULTS.seed)
    trace.add_argument("-o", "--output", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "sim":
            return run_sim(args)
        if args.command == "live":
            from executor.live import run_live

            return run_live(args)
        if args.command == "app":
            from app.launch import run_app

            return run_app(args)
        if args.command == "profile":
            return run_profile(args)
        if args.command == "validate":
            from profiles.validate import run_validate

            return run_validate(args)
        return run_trace(args)
    except (UsageError, ValueError, OSError, RuntimeError) as err:
        print(f"sangam: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sangam: interrupted", file=sys.stderr)
        return 130


def run_config(args: argparse.Namespace, qps: float) -> RunConfig:
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    given.update(qps=qps, policy=Policy(args.policy))
    return RunConfig(**given)


def run_sim(args: argparse.Namespace) -> int:
    from profiles.analytic import AnalyticCostModel
    from profiles.store import default_cost_model
    from sangam.config import synthetic_rows, with_arrival_times
    from sangam.hardware import lookup_gpu, lookup_model
    from sangam.progress import empirical, parse_progress
    from sangam.report import print_sim_table
    from sangam.results import ITERATION_COLUMNS, write_csv, write_results
    from sangam.traces import read_steps, read_trace
    from sim.cluster import LinkSpec
    from sim.links import load_link
    from sim.run import simulate

    rates = [q for group in args.qps for q in group]
    if not rates:
        raise UsageError("--qps needs at least one positive rate")
    if args.cost == "profile":
        cost, cost_name, profile = default_cost_model(args.model, args.gpu)
    else:
        cost, cost_name, profile = (
            AnalyticCostModel(lookup_model(args.model), lookup_gpu(args.gpu)),
            "analytic",
            None,
        )
    if profile is not None and args.pages is None and profile.kv_pages is not None:
        args.pages = profile.kv_pages  # what the live worker has for the same model and GPU
    configs = [run_config(args, q) for q in rates]
    progress = None
    if args.progress:
        kind, _, path = args.progress.partition(":")
        progress = empirical(read_steps(Path(path))) if kind == "empirical" else parse_progress(args.progress)
    file_rows = None if configs[0].is_synthetic else read_trace(Path(args.trace))
    if file_rows is not None and len(rates) > 1 and file_rows[0].arrival_time is not None:
        raise UsageError(
            f"{args.trace}: every row has an arrival_time, so each --qps point would replay the same "
            "arrivals; give one rate"
        )
    link = load_link(args.link) if args.link else LinkSpec(args.link_gbps, args.link_latency_ms / 1000)
    kv_link = {"source": args.link or "assumed", "gb_per_s": link.gb_per_s, "latency_s": link.latency_s}
    results = []
    for cfg in configs:
        if file_rows is None:
            rows = synthetic_rows(cfg)
        else:
            rows = with_arrival_times(cfg, file_rows[: cfg.num_requests])
            cfg = dataclasses.replace(cfg, num_requests=len(rows))  # a trace may be shorter
        result = simulate(
            cfg,
            rows,
            cost,
            progress=progress,
            link=link,
            control_s=args.control_ms / 1000,
            log_iterations=bool(args.iteration_log),
        )
        result.summary.update(cost_model=cost_name, kv_link=kv_link, control_ms=args.control_ms)
        results.append(result)
        several = len(configs) > 1
        if args.out:
            write_results(
                args.out / f"qps-{cfg.qps:g}" if several else args.out, result.requests, result.summary
            )
        if args.iteration_log and result.iterations is not None:
            log = args.iteration_log
            path = log.with_name(f"{log.stem}-qps{cfg.qps:g}{log.suffix}") if several else log
            write_csv(path, ITERATION_COLUMNS, result.iterations)
    print_sim_table([r.summary for r in results])
    return 0


def run_profile(args: argparse.Namespace) -> int:
    from profiles.store import DATA, load_profile, merge_log
    from sangam.hardware import lookup_gpu, lookup_model

    lookup_model(args.model)  # unknown names fail before any GPU is looked for
    lookup_gpu(args.gpu)

    root = args.out or DATA
    if args.from_log:
        merge_log(args.model, args.gpu, args.from_log, root)
    else:
        from profiles.runner import run_profile as measure

        data, _ = measure(
            args.model, args.gpu, root, weights=args.weights, graphs=args.cuda_graphs, repeats=args.repeats
        )
        print(f"wrote {data}")
    profile = load_profile(args.model, args.gpu, root)
    assert profile is not None
    r = profile.report
    print(
        f"{args.model} on {args.gpu}: {r['points']} iterations, model {r['candidate']!r}; held out "
        f"({r['folds']}-fold): MAPE {r['heldout_mape']:.2f}%, P90 {r['heldout_p90']:.2f}%, "
        f"max {r['heldout_max']:.2f}%"
    )
    return 0


def run_trace(args: argparse.Namespace) -> int:
    from sangam.config import synthetic_rows
    from sangam.traces import write_trace

    cfg = RunConfig(trace=args.dataset, num_requests=args.num_requests, qps=args.qps, seed=args.seed)
    rows = synthetic_rows(cfg)
    write_trace(args.output, rows)
    print(f"wrote {len(rows)} requests to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
