"""The plan that `benchmarks/refpeer/sched_loop.py` replays through the reference's real scheduler: the
simulator's own requests of one point (lengths, clipped Poisson arrivals, every block's forwards) and
what the fake workers sleep for (the testbed's iteration-time model and KV link).

    python -m benchmarks.ref_loop_plan --testbed paper-h100 --qps 7.5 -n 600 --out plan.json

Runs in our process; the replay runs in the reference's (its package is also named `sangam`). The
fake workers price an iteration with the profile's formula (`profiles/measured.py`) from the exported
coefficients and graph buckets' lines; `checks` holds a few shapes priced here, which the replay
recomputes and must match.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from profiles.testbeds import load_testbed, testbed_config, testbed_profile
from runs.config import RunConfig, build_requests, workload_points
from sangam.batcher import Microbatch
from sangam.progress import parse_progress
from sangam.request import Request
from sim.options import options_on_testbed

CHECK_SHAPES = (
    ((1800,), ()), ((), (1800,)), ((), (1800,) * 5), ((), (300, 2600, 900)), ((), (1500,) * 40),
    ((1200,), (1900,) * 3),
)  # fmt: skip


def _priced(cost: Any, prefills: tuple[int, ...], decodes: tuple[int, ...]) -> float:
    def req(i: int, seq: int) -> Request:
        return Request(i, 0.0, seq - 1024, 32, 1024, (2,))

    mb = Microbatch(
        decodes=tuple(req(i, s) for i, s in enumerate(decodes)),
        prefills=tuple(req(100 + i, s) for i, s in enumerate(prefills)),
        waiting=0,
        deficit_before=0,
        budget=0.0,
        deficit_after=0,
    )
    return float(cost.seconds(mb))


def plan(testbed_name: str, model: str, qps: float, n: int, seed: int) -> dict[str, Any]:
    testbed = load_testbed(testbed_name)
    profile = testbed_profile(testbed, model)
    if profile is None:
        raise ValueError(f"testbed {testbed.name} has no profile of {model}")
    base = RunConfig(model=model, trace="sharegpt", qps=qps, num_requests=n, seed=seed)
    cfg = testbed_config(testbed, base, profile, {})
    ((cfg, rows),) = workload_points(cfg, [qps])
    spec = testbed.progress_spec(model, "sharegpt")
    requests = build_requests(cfg, rows, parse_progress(spec))
    link = options_on_testbed(testbed, {}).link_spec()
    cost = profile.cost_model()
    return {
        "testbed": f"{testbed.name} v{testbed.version}",
        "model": model,
        "qps": qps,
        "seed": seed,
        "arrival_clip": cfg.arrival_clip,
        "mask_len": cfg.mask_tokens,
        "progress": spec,
        "kv_pages": cfg.kv_pages,
        "kv_bytes_per_token": cfg.kv_bytes_per_token,
        "link": {"gb_per_s": link.gb_per_s, "latency_s": link.latency_s, "source": testbed.link.source},
        "profile": {
            "source": testbed.profile_source,
            "gpu": profile.gpu,
            "coefficients": dataclasses.asdict(profile.coefficients),
            "buckets": list(profile.buckets),
            "graph_times": dataclasses.asdict(profile.graphs) if profile.graphs is not None else None,
        },
        "checks": [
            {"prefills": list(p), "decodes": list(d), "seconds": _priced(cost, p, d)} for p, d in CHECK_SHAPES
        ],
        "requests": [
            {
                "id": r.id,
                "arrival": r.arrival,
                "prompt_len": r.prompt_len,
                "output_len": r.output_len,
                "steps": list(r.steps),
            }
            for r in requests
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", default="paper-h100")
    parser.add_argument("--model", default="llada-8b")
    parser.add_argument("--qps", type=float, default=7.5)
    parser.add_argument("-n", "--num-requests", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        data = plan(args.testbed, args.model, args.qps, args.num_requests, args.seed)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(data))
    span = data["requests"][-1]["arrival"]
    blocks = sum(len(r["steps"]) for r in data["requests"])
    print(f"{args.out}: {len(data['requests'])} requests, {blocks} blocks, arrivals over {span:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
