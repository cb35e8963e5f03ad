"""Sangam's policy core: requests, the Algorithm 1 batcher, the routers, KV page accounting, layouts,
forwards per block and workloads; pure (time is an argument, randomness a generator passed in)."""

__version__ = "0.1.0"
