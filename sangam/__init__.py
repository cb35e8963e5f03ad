"""Sangam: serving cached diffusion LLMs (LLaDA-8B, Dream-7B with Fast-dLLM block caching)."""

from sangam import compiled

compiled.guard()  # before any compiled module is imported (sangam/compiled.py)

__version__ = "0.1.0"
