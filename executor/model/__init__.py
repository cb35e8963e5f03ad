"""Model execution on one device: our bidirectional transformer for LLaDA and Dream (configs, weights,
layers), the paged KV cache, packing a microbatch into one ragged forward, attention backends, decode
CUDA graphs and the sampler.

Nothing is imported here, so the names of the models a run can serve (`live_models`) stay importable
without torch.
"""
