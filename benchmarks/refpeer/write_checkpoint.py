"""Write a random bf16 LLaDA-8B checkpoint directory in the layout the reference implementation's loader
reads (`sangam.model.model_loader.load_model`: `config.json` naming `LLaDAModelLM`, then transformers'
`from_pretrained` of safetensors shards with an index).

Runs in the reference's process (PYTHONPATH=<reference>/src:benchmarks/refpeer/shim, none of our packages):
the tensor names and shapes are those of the reference's own model, built on the meta device, so the
file holds exactly what its loader expects. Each tensor is drawn N(0, 0.02) on --device (the GPU: 16 GB
in seconds) and written shard by shard (--shard-gb).

    python3 benchmarks/refpeer/write_checkpoint.py --out /tmp/llada-random --device cuda
    python3 benchmarks/refpeer/write_checkpoint.py --out /tmp/tiny --tiny --check   # CPU, 2 layers
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from refpath import require_reference

# The public config.json of GSAI-ML/LLaDA-8B-Instruct (architecture fields).
LLADA_8B = {
    "architectures": ["LLaDAModelLM"],
    "model_type": "llada",
    "activation_type": "silu",
    "alibi": False,
    "alibi_bias_max": 8.0,
    "attention_dropout": 0.0,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "bias_for_layer_norm": False,
    "block_group_size": 1,
    "block_type": "llama",
    "d_model": 4096,
    "embedding_dropout": 0.0,
    "embedding_size": 126464,
    "eos_token_id": 126081,
    "flash_attention": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "init_cutoff_factor": None,
    "init_device": "meta",
    "init_fn": "mitchell",
    "init_std": 0.02,
    "input_emb_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "mask_token_id": 126336,
    "max_sequence_length": 4096,
    "mlp_hidden_size": 12288,
    "mlp_ratio": 4,
    "multi_query_attention": None,
    "n_heads": 32,
    "n_kv_heads": 32,
    "n_layers": 32,
    "pad_token_id": 126081,
    "precision": "amp_bf16",
    "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05,
    "rope": True,
    "rope_full_precision": True,
    "rope_theta": 500000.0,
    "scale_logits": False,
    "torch_dtype": "bfloat16",
    "use_cache": False,
    "vocab_size": 126464,
    "weight_tying": False,
}
# --tiny: 2 layers, a small vocabulary; head_dim stays 128 (FlashInfer's kernels are those of the 8B).
TINY = {
    "d_model": 256,
    "n_heads": 2,
    "n_kv_heads": 2,
    "n_layers": 2,
    "mlp_hidden_size": 512,
    "vocab_size": 1024,
    "embedding_size": 1024,
    "mask_token_id": 1000,
    "eos_token_id": 1,
    "pad_token_id": 1,
}
INDEX = "model.safetensors.index.json"


def config(tiny: bool) -> dict:
    return {**LLADA_8B, **(TINY if tiny else {})}


def tensor_specs(cfg: dict) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Name -> (shape, is a norm weight) of every tensor the reference's LLaDAModelLM loads."""
    import torch
    from sangam.model.llada import LLaDAConfig, LLaDAModelLM
    from sangam.model.llada.modeling_llada import LLaDAModel, create_model_config_from_pretrained_config

    hf = LLaDAConfig(**cfg)
    inner_cfg = create_model_config_from_pretrained_config(hf)
    inner_cfg.init_device = "meta"
    with torch.device("meta"):
        model = LLaDAModelLM(hf, model=LLaDAModel(inner_cfg, init_params=False))
    return {name: (tuple(t.shape), "norm" in name) for name, t in model.state_dict().items()}


def write(out: Path, cfg: dict, device: str, shard_gb: float, seed: int) -> dict:
    import torch
    from safetensors.torch import save_file

    specs = tensor_specs(cfg)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    limit = shard_gb * 2**30
    for name, (shape, norm) in specs.items():
        t = torch.empty(shape, dtype=torch.bfloat16, device=device)
        if norm:
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        nbytes = t.numel() * 2
        if sizes[-1] and sizes[-1] + nbytes > limit:
            shards.append({})
            sizes.append(0)
        shards[-1][name] = t
        sizes[-1] += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
        shard.clear()
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return {"tensors": len(specs), "bytes": sum(sizes), "shards": len(shards)}


def check(out: Path) -> str:
    """Load the directory as the reference's loader does (on CPU) and report what did not match."""
    import torch
    from sangam.model.model_loader import _read_hf_config
    from sangam.model.registry import resolve_model_classes

    _, model_cls = resolve_model_classes(_read_hf_config(str(out)).get("architectures", []))
    model, info = model_cls.from_pretrained(str(out), dtype=torch.bfloat16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"the reference's loader did not take the checkpoint as written: {bad}")
    from safetensors.torch import load_file

    weight_map = json.loads((out / INDEX).read_text())["weight_map"]
    loaded = model.state_dict()
    for fname in sorted(set(weight_map.values())):
        for name, saved in load_file(str(out / fname)).items():
            if not torch.equal(loaded[name], saved):
                raise SystemExit(f"{name}: the loaded tensor differs from the one written")
    model.fuse_qkv()
    return f"{type(model).__name__}: every tensor loaded as written, qkv fused"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer config (CPU tests)")
    parser.add_argument("--device", default="cpu", help="where the tensors are drawn (cuda: fast)")
    parser.add_argument("--shard-gb", type=float, default=4.0, help="GiB per safetensors file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="then load it with the reference's loader")
    args = parser.parse_args(argv)
    require_reference()
    t0 = time.perf_counter()
    done = write(args.out, config(args.tiny), args.device, args.shard_gb, args.seed)
    print(
        f"wrote {done['tensors']} tensors, {done['bytes'] / 2**30:.2f} GiB in {done['shards']} shards to "
        f"{args.out} in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    if args.check:
        print(check(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
