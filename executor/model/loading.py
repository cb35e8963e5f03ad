"""Build a `Transformer` from a local HF checkpoint, or with random weights for timing runs."""

from __future__ import annotations

from pathlib import Path

import torch

from executor.model.checkpoint import checkpoint_names, read_fused
from executor.model.config import ModelConfig
from executor.model.hf_config import read_config
from executor.model.transformer import Transformer


def load_checkpoint(
    directory: str | Path, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
) -> Transformer:
    """The model in `directory` (config.json plus safetensors), fused, on `device`, in eval mode.

    Parameters are created on the meta device and then take the loaded tensors as they are, so the
    unfused checkpoint tensors never coexist with a second full copy of the model.
    """
    path, device = Path(directory), torch.device(device)
    config = read_config(path)
    with torch.device("meta"):
        model = Transformer(config)
    state = dict(read_fused(path, checkpoint_names(config), dtype, device))
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


@torch.no_grad()
def random_model(
    config: ModelConfig,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    std: float = 0.02,
) -> Transformer:
    """The model with N(0, std) weights and unit norms, allocated once in `dtype` on `device`."""
    with torch.device("meta"):
        model = Transformer(config).to(dtype)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=generator)
    return model.eval()
