"""KV transfer between live workers: torch.distributed links (`links`) and a worker's own ends of each
transfer (`ends`), which carry out the control plane's transfer orders."""
