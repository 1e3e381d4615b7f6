"""Multi-rank stages on torch.distributed: Ulysses sequence parallelism, height-sharded decode."""
