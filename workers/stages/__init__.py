"""The three pipeline stages (condition encode, DiT denoise, VAE decode), one per file.

Each stage keeps per-session state and exposes plain tensor-in, tensor-out calls, so the serial
engine can chain them in one process and a worker runtime can host each in its own process.
"""
