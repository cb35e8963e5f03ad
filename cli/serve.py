"""`sangam serve`: `sangam live`'s processes behind an OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from executor.model.live_models import TINY_PAGES
from executor.run.live_options import LiveOptions, with_env_api_key
from runs.config import RunConfig, RunFiles
from runs.options import add_options, collect
from serve.options import ServeOptions

# sangam live's options that make no sense for a server: the replay's, and its gRPC client address (serve
# binds the scheduler's client port on loopback, any free port; --host/--port are the HTTP server's)
LIVE_ONLY = ("host", "port", "serve", "stall_timeout")
LAYOUT = (
    "mode", "gpu", "mask_len", "budget", "prefill_budget", "theta", "policy", "max_decodes", "pages",
    "kv_cache_dtype", "seed",
)  # fmt: skip


def add_parser(commands: Any, name: str) -> None:
    parser = commands.add_parser(
        name, help="an OpenAI-compatible HTTP server (completions, chat, metrics) over live workers"
    )
    add_options(parser.add_argument_group("HTTP server"), ServeOptions)
    add_options(parser.add_argument_group("processes (as in sangam live)"), LiveOptions, skip=LIVE_ONLY)
    add_options(
        parser.add_argument_group("layout and scheduling (as in sangam live)"), RunConfig, only=LAYOUT,
        defaults={"mask_len": 1024},
        default_text={
            "gpu": "h100; sizes the default KV pool as in sangam sim",
            "pages": f"{TINY_PAGES} for the tiny models, else from GPU memory",
        },
    )  # fmt: skip
    add_options(parser.add_argument_group("output"), RunFiles, only=("out", "iteration_log"))


def run(args: argparse.Namespace) -> int:
    from executor.run.live import plan_run
    from serve.server import run_server

    live = with_env_api_key(collect(LiveOptions, args, host="127.0.0.1", port=0, serve=True), os.environ)
    base = collect(RunConfig, args, gpus=1, model=RunConfig().model)
    plan = plan_run(base, live)
    files = collect(RunFiles, args)
    plan = replace(plan, cluster=replace(plan.cluster, iteration_log=files.iteration_log))
    return run_server(plan, live, collect(ServeOptions, args), files.out)
