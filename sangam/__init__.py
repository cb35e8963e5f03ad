"""Sangam: serving cached diffusion LLMs (LLaDA-8B, Dream-7B with Fast-dLLM block caching)."""

__version__ = "0.1.0"
