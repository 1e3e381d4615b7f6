"""Write a safetensors file from host tensors, piece by piece, without a copy of the whole.

`safetensors.torch.save_file` first builds the file's bytes in memory: a second copy of everything
(26 GiB for a 14B session's state) made while holding the GIL, which stalls every other thread of
the process (a stage worker's command loop, while its writer thread saves). Here the header is
written, then each tensor's own bytes straight from its storage in `PIECE_BYTES` writes; each write
releases the GIL, and nothing larger than the header is allocated. The file is the format's own
(read back by `safetensors.torch.load_file` and by `workers/models/loading.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from workers.models.loading import SAFETENSORS_DTYPES

PIECE_BYTES = 64 * 2**20  # per write: long enough to stream at disk speed, short enough to share the GIL
_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
_ALIGN = 8  # the format pads its header so that the data starts 8-byte aligned


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """`tensors` (on the host) to `path` in the safetensors format, in the mapping's order."""
    header: dict[str, dict[str, object]] = {}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.device.type != "cpu":
            raise ValueError(f"{name}: a tensor on {tensor.device} must be on the host to be written")
        nbytes = tensor.numel() * tensor.element_size()
        span = [offset, offset + nbytes]
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": span}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % _ALIGN)
    with path.open("wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for tensor in tensors.values():
            data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data  # the storage's own bytes
            for start in range(0, len(data), PIECE_BYTES):
                f.write(data[start : start + PIECE_BYTES])
