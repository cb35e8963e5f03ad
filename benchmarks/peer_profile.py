"""Time the reference implementation's worker iteration over `sangam profile`'s grid, as a peer profile.

The reference (the paper authors' code, `../shared/peers/`) has a package named `sangam` too, so the timing
runs in its own process, with none of our packages importable:

    python3 -m benchmarks.peer_profile shapes --json shapes.json          # our grid, as the probe's specs
    PYTHONPATH=<reference>/src python3 benchmarks/peer_profile.py probe --probe ref_probe.py \
        --shapes shapes.json -- --json probe.json --kv-max-pages 13167   # the reference, timed
    python3 -m benchmarks.peer_profile store --probe-json probe.json --out profiles/data/h200-reference

`probe` drives the shared `ref_probe.py` (which builds the reference's own model, KV pool, packing,
FlashInfer plans, CUDA graphs and sampler, and times `ColocatedWorkerServicer._do_run_mixed_iteration_local`)
with two changes made from outside: the shapes are our grid's, and every timed call follows a filler
of serving-like work (one 1024-token prefill, then four one-decode steps at context 1819: the filler
`calib.profile_runner` ran before each of our timed steps up to 2026-12-04; ours is now mostly mixed steps,
which the reference's probe does not build), so both executors meet each shape in a like GPU power state.
`store` writes `<out>/<model>.csv` (our profile format: items, seconds) and `<out>/<model>.meta.json`;
`compare --ours A.csv --reference B.csv` prints the reference's time over ours per kind of shape.
`benchmarks/h200_peer.sh` runs the steps on the H200, ours and the reference's in the same call.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

FILLER_PREFILL = 1024
FILLER_DECODE_CONTEXT = 1819
FILLER_DECODES = 4
PEER = "UT-InfraAI/sangam"
PEER_COMMIT = "bf5f000"
# The public config.json of Dream-org/Dream-v0-Instruct-7B (architecture fields): `probe --model dream-7b`.
DREAM_7B = {
    "architectures": ["DreamModel"],
    "model_type": "Dream",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
    "mask_token_id": 151666,
    "pad_token_id": 151643,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "use_cache": False,
}
# --tiny / --dry-run: 2 layers, head_dim 128 as in the 7B, grouped KV heads as in the 7B.
DREAM_TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1024,
    "mask_token_id": 1000,
    "pad_token_id": 1,
    "bos_token_id": 1,
    "eos_token_id": 1,
}


def shapes(args: argparse.Namespace) -> int:
    from calib.profile_runner import grid
    from sangam.hardware import kv_pages, lookup_gpu, lookup_model

    pages = args.pages or kv_pages(lookup_model(args.model), lookup_gpu(args.gpu))
    specs = [
        {"name": s.format(), "prefill": list(s.prefills), "decode": list(s.decodes)} for s in grid(pages)
    ]
    Path(args.json).write_text(json.dumps({"kv_pages": pages, "shapes": specs}, indent=1))
    print(f"{len(specs)} shapes for {pages} pages -> {args.json}")
    return 0


def probe(args: argparse.Namespace, probe_argv: list[str]) -> int:
    """Run ref_probe.main with our shapes and our filler; its JSON carries one row per shape."""
    if "sangam" in sys.modules:
        raise SystemExit("the reference's `sangam` package must be the only one in this process")
    spec = importlib.util.spec_from_file_location("ref_probe", args.probe)
    assert spec is not None and spec.loader is not None
    rp = importlib.util.module_from_spec(spec)
    sys.modules["ref_probe"] = rp
    spec.loader.exec_module(rp)
    grid = json.loads(Path(args.shapes).read_text())["shapes"]

    def our_shapes(a: Any) -> list[dict[str, Any]]:
        top = max(a.buckets)
        out = []
        for g in grid:
            graphed = not g["prefill"] and 0 < len(g["decode"]) <= top
            kind = "mixed" if g["prefill"] and g["decode"] else ("prefill" if g["prefill"] else "decode")
            out.append({**g, "kind": kind, "mode": "graph" if graphed else "eager"})
        return out

    current: dict[str, Any] = {}
    measure_shape, time_loop = rp.measure_shape, rp.time_loop

    def measure_with_harness(h: Any, spec: dict[str, Any], impl: str) -> dict[str, Any]:
        current["h"], current["impl"] = h, impl
        return measure_shape(h, spec, impl)

    def filler() -> None:
        if "h" not in current:  # the probe's own warm-ups, before the first shape
            return
        h = current["h"]
        run = h.iteration_worker if current["impl"] == "worker" else h.iteration_replica
        pre = h.make_prefill_req("filler-p", FILLER_PREFILL)
        for res in run([pre], [])[0]:
            h.pool.free(res["kv_state"].page_ids)
        if "decode" not in current:
            current["decode"] = h.make_decode_req("filler-d", FILLER_DECODE_CONTEXT)
        for _ in range(FILLER_DECODES):
            h.reset_decodes([current["decode"]])
            run([], [current["decode"]])

    def time_after_filler(
        prepare: Any, call: Any, cleanup: Any, warmup: int, iters: int, release: Any = None
    ) -> Any:
        def prepare_after_filler() -> Any:
            filler()
            return prepare()

        return time_loop(prepare_after_filler, call, cleanup, warmup, iters, release)

    if args.model == "dream-7b":
        use_dream(rp)
    rp.build_shapes = our_shapes
    rp.measure_shape = measure_with_harness
    rp.time_loop = time_after_filler
    rp.NOTES.append(
        f"driven by benchmarks/peer_profile.py: Sangam's profile grid; each timed call follows a filler of "
        f"one {FILLER_PREFILL}-token prefill and {FILLER_DECODES} one-decode steps at context "
        f"{FILLER_DECODE_CONTEXT}"
    )
    return int(rp.main(probe_argv))


def use_dream(rp: Any) -> None:
    """Make the probe build the reference's own Dream model (`sangam.model.dream.DreamModel`) instead of
    LLaDA: its config (the public 7B one, or a 2-layer one with --tiny/--dry-run), random bf16 weights
    drawn by the model's own initialiser on the device, then `fuse_qkv` and `fuse_ff_gate_up`, as the
    reference's loader does after `from_pretrained`. Everything after the model (KV pool sized from the
    model's layers and heads, packing, plans, graphs, sampler, the worker's iteration call) is the
    probe's, unchanged; the model's own `requires_logit_shift` makes the reference's runner shift
    Dream's logits as it does when serving."""

    def dream_config(a: Any) -> dict[str, Any]:
        tiny = getattr(a, "tiny", False) or getattr(a, "dry_run", False)
        return {**DREAM_7B, **(DREAM_TINY if tiny else {})}

    def build_dream(r: Any, device: Any, dtype: Any, cfg_dict: dict[str, Any]) -> tuple[Any, Any, dict]:
        import torch
        from sangam.model.dream import DreamConfig, DreamModel

        config = DreamConfig(
            **{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")}
        )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = DreamModel(config)
        finally:
            torch.set_default_dtype(previous)
        model = model.to(device).eval()
        model.fuse_qkv()
        model.fuse_ff_gate_up()
        checks = {
            "model_class": type(model).__name__,
            "num_layers": model.num_layers,
            "num_q_heads": model.num_q_heads,
            "num_kv_heads": model.num_kv_heads,
            "head_dim": model.head_dim,
            "requires_logit_shift": bool(getattr(model, "requires_logit_shift", False)),
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "param_devices": sorted({str(p.device) for p in model.parameters()}),
            "params_billion_incl_fused_dups": round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
            # the probe asks for these three of LLaDA's blocks; Dream's fusions are the two calls above
            "all_qkv_fused": True,
            "all_ff_fused": True,
            "all_fused_mlp_norm_path": True,
        }
        return model, config, checks

    rp.effective_config = dream_config
    rp.build_model = build_dream
    rp.NOTES.append(
        "model: the reference's DreamModel with Dream-v0-Instruct-7B's config (peer_profile.use_dream)"
    )


def store(args: argparse.Namespace) -> int:
    payload = json.loads(Path(args.probe_json).read_text())
    rows = [r for r in payload["rows"] if r.get("iter_ms")]
    failed = [r for r in payload["rows"] if not r.get("iter_ms")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / f"{args.model}.csv"
    with data.open("w") as f:
        f.write("items,seconds\n")
        f.writelines(f"{r['shape']},{r['iter_ms']['median'] / 1e3:.6e}\n" for r in rows)
    pa = payload["args"]
    meta = {
        "model": args.model,
        "gpu": args.gpu,
        "executor": f"reference implementation {PEER} at {PEER_COMMIT}",
        "peer": PEER,
        "peer_commit": PEER_COMMIT,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "weights": "random",
        "versions": payload.get("versions"),
        "impl": payload.get("impls"),
        "flashinfer_backend": payload.get("flashinfer_backend"),
        "sampling": payload.get("sampling"),
        "timing": (
            f"median of {pa.get('iters')} CUDA-event times of the reference worker's iteration call after "
            f"{pa.get('warmup')} warm-up, each after the filler; its per-iteration report RPC is not included"
        ),
        "filler": [
            f"p:{FILLER_PREFILL}:{FILLER_PREFILL}",
            *[f"d:32:{FILLER_DECODE_CONTEXT}"] * FILLER_DECODES,
        ],
        "kv_pages": pa.get("kv_max_pages"),
        "graph_buckets": [b for b in payload.get("graph_buckets", []) if b <= args.max_bucket],
        "points": len(rows),
        "failed_shapes": [{"shape": r["shape"], "why": r.get("error") or r.get("skipped")} for r in failed],
        "shims": payload.get("shims"),
        "notes": payload.get("notes"),
        "setup": payload.get("setup"),
    }
    data.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{len(rows)} shapes -> {data} ({len(failed)} failed or skipped)")
    return 0


def _times(path: str) -> dict[str, float]:
    with open(path) as f:
        return {row["items"]: float(row["seconds"]) for row in csv.DictReader(f)}


def _group(items: str) -> str:
    prefills, decodes = items.count("p:"), items.count("d:")
    if not decodes:
        return "prefill only" if prefills == 1 else "several prefills"
    if not prefills:
        return f"decode only, B={decodes}"
    return "prefill + decodes"


def compare(args: argparse.Namespace) -> int:
    """Reference time over ours per shape (both measured in the same call), summarised per kind of shape."""
    ours, reference = _times(args.ours), _times(args.reference)
    shared = [items for items in reference if items in ours]
    ratios: dict[str, list[float]] = {}
    for items in shared:
        ratios.setdefault(_group(items), []).append(reference[items] / ours[items])
    print(f"{'shapes':<22}{'n':>4}{'median':>9}{'min':>7}{'max':>7}   reference time / ours")
    order = ["prefill only", "several prefills", "prefill + decodes"]
    for group, values in sorted(
        ratios.items(),
        key=lambda kv: (
            kv[0] not in order,
            order.index(kv[0]) if kv[0] in order else int(kv[0].split("=")[1]),
        ),
    ):
        print(
            f"{group:<22}{len(values):>4}{statistics.median(values):>9.2f}{min(values):>7.2f}{max(values):>7.2f}"
        )
    every = [reference[i] / ours[i] for i in shared]
    print(f"{'all':<22}{len(every):>4}{statistics.median(every):>9.2f}{min(every):>7.2f}{max(every):>7.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    steps = parser.add_subparsers(dest="step", required=True)
    s = steps.add_parser("shapes")
    s.add_argument("--model", default="llada-8b")
    s.add_argument("--gpu", default="h200")
    s.add_argument("--pages", type=int, default=None, help="KV capacity the grid must fit (default: ours)")
    s.add_argument("--json", required=True)
    p = steps.add_parser("probe")
    p.add_argument("--probe", required=True, help="path to ref_probe.py")
    p.add_argument("--shapes", required=True, help="the JSON written by `shapes`")
    p.add_argument("--model", default="llada-8b", choices=("llada-8b", "dream-7b"), help="the model timed")
    t = steps.add_parser("store")
    t.add_argument("--probe-json", required=True)
    t.add_argument("--model", default="llada-8b")
    t.add_argument("--gpu", default="h200")
    t.add_argument("--max-bucket", type=int, default=128, help="graphed batch sizes kept in the metadata")
    t.add_argument("--out", required=True)
    c = steps.add_parser("compare")
    c.add_argument("--ours", required=True, help="our profile CSV (items, seconds)")
    c.add_argument("--reference", required=True, help="the reference's, from `store`")
    args = parser.parse_args(argv)
    if args.step == "probe":
        return probe(args, rest)
    return {"shapes": shapes, "store": store, "compare": compare}[args.step](args)


if __name__ == "__main__":
    raise SystemExit(main())
