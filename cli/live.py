"""`sangam live`: a scheduler process and one worker process per GPU, replaying a workload or serving."""

from __future__ import annotations

import argparse
import os
from typing import Any

from executor.model.live_models import TINY_PAGES
from executor.run.live_options import CPU_NUM_REQUESTS, LIVE_NUM_REQUESTS, LiveOptions, with_env_api_key
from runs.config import RunConfig, RunFiles
from runs.options import add_options, collect, listed


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="serve live: a scheduler process and one worker process per GPU (CPU workers without one)"
    )
    add_live_arguments(parser)


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument_group("processes"), LiveOptions)
    add_options(
        parser.add_argument_group("workload and scheduling (as in sangam sim)"), RunConfig,
        skip=("model", "gpus"),
        defaults={"num_requests": None},
        default_text={
            "num_requests": f"{LIVE_NUM_REQUESTS}, {CPU_NUM_REQUESTS} on CPU",
            "gpu": "h100; sizes the default KV pool as in sangam sim",
            "pages": f"{TINY_PAGES} for the tiny models, else from GPU memory",
        },
    )  # fmt: skip
    add_options(parser.add_argument_group("output"), RunFiles)


def run(args: argparse.Namespace) -> int:
    from cli.bars import bar
    from executor.run.live import plan_run, run_live

    options = with_env_api_key(collect(LiveOptions, args), os.environ)
    given = args.num_requests is not None
    # --gpus and --model are LiveOptions' here: plan_run resolves the config's from them
    placeholders = {"gpus": 1, "model": RunConfig().model, "qps": RunConfig().qps}
    base = collect(RunConfig, args, num_requests=args.num_requests or LIVE_NUM_REQUESTS, **placeholders)
    plan = plan_run(base, options, requests_given=given)
    if options.serve:
        return run_live(plan, options, collect(RunFiles, args), listed(args, "qps", base.qps))
    with bar("live", "requests finished") as watch:
        return run_live(plan, options, collect(RunFiles, args), listed(args, "qps", base.qps), watch)
