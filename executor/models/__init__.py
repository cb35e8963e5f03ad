"""Our own bidirectional transformer for LLaDA and Dream, its configs and its weight loading."""

from executor.models.config import Family, ModelConfig, full_size, tiny
from executor.models.hf_config import read_config
from executor.models.loading import load_checkpoint, random_model
from executor.models.transformer import LayerAttention, Transformer

__all__ = [
    "Family",
    "LayerAttention",
    "ModelConfig",
    "Transformer",
    "full_size",
    "load_checkpoint",
    "random_model",
    "read_config",
    "tiny",
]
