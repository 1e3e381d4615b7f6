"""A stage's per-session state, captured and restored: what a snapshot holds of one stage.

Each stage keeps a session as plain objects: the DiT's denoise session (its KV caches, the
context's K/V, the seeded generator, RoPE tables) and control track (the camera pose or the action
history), the condition stream (the VAE encoder's causal caches, or its fixed point), the decode
session (the decoder's causal caches). Those objects also point at what every session of the stage
shares and a snapshot must not copy: the model's modules and the stage's process group.

`capture` copies the first and names the second. The object graph is pickled with every tensor and
every shared object replaced by a reference: tensors go into a list of copies (on the stage's
device first; `StatePart.to_host` moves them), shared objects by the name the caller gave them. So
new state a session class gains is captured without anything here changing, and a module or a
process group a session points at is never copied (an unnamed one is an error, not a silent copy of
the weights). `restore` rebuilds the graph with fresh copies of the tensors on the stage's device
and the stage's own shared objects, so one part restores into any number of independent sessions.

The structure is a pickle, read back only by the server that wrote it (memory, or its own spill
directory): it is never accepted from a client.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from workers.models.safetensors_writer import write_safetensors


class StateCaptureError(TypeError):
    pass


@dataclass(frozen=True)
class StatePart:
    """One session object's state: `structure` (the pickled graph) and its tensors' copies."""

    structure: bytes
    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return len(self.structure) + sum(t.numel() * t.element_size() for t in self.tensors)

    def to_host(self) -> StatePart:
        """The part with every tensor on the host (a no-op for a CPU stage's part)."""
        if all(t.device.type == "cpu" for t in self.tensors):
            return self
        return StatePart(self.structure, tuple(t.to("cpu") for t in self.tensors))

    def save(self, path: Path) -> None:
        """Spill: `path`.pickle (the structure) and `path`.safetensors (the tensors)."""
        path.with_suffix(".pickle").write_bytes(self.structure)
        write_safetensors({str(i): t for i, t in enumerate(self.tensors)}, path.with_suffix(".safetensors"))

    @staticmethod
    def load(path: Path) -> StatePart:
        tensors = load_file(str(path.with_suffix(".safetensors")))
        return StatePart(path.with_suffix(".pickle").read_bytes(), tuple(tensors[str(i)] for i in range(len(tensors))))


class _Capture(pickle.Pickler):
    def __init__(self, file: io.BytesIO, shared: Mapping[str, object]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared = {id(obj): name for name, obj in shared.items() if obj is not None}
        self.tensors: list[torch.Tensor] = []
        self.seen: dict[int, int] = {}  # id(tensor) -> index: a tensor referenced twice is copied once

    def persistent_id(self, obj: Any) -> tuple[str, str | int] | None:
        name = self.shared.get(id(obj))
        if name is not None:
            return ("shared", name)
        if isinstance(obj, torch.Tensor):
            index = self.seen.get(id(obj))
            if index is None:
                index = self.seen[id(obj)] = len(self.tensors)
                self.tensors.append(obj.detach())  # copied once the graph is walked (`capture`)
            return ("tensor", index)
        if isinstance(obj, torch.nn.Module):
            raise StateCaptureError(f"a session points at a {type(obj).__name__} the capture was not told to share")
        return None


class _Restore(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, part: StatePart, shared: Mapping[str, object], device: torch.device) -> None:
        super().__init__(file)
        self.part, self.shared, self.device = part, shared, device
        self.made: dict[int, torch.Tensor] = {}

    def persistent_load(self, pid: tuple[str, str | int]) -> Any:
        kind, key = pid
        if kind == "shared":
            return self.shared[str(key)]
        index = int(key)
        if index not in self.made:
            self.made[index] = self.part.tensors[index].to(self.device, copy=True)
        return self.made[index]


# Where each tensor of a capture into host memory starts in its buffer: aligned for every dtype.
_ALIGN_BYTES = 64

HostMemory = Callable[[int], torch.Tensor]  # bytes -> a uint8 host buffer of at least that many


def _walk(obj: object, shared: Mapping[str, object]) -> tuple[bytes, list[torch.Tensor]]:
    """The pickled graph and the tensors it references, not yet copied."""
    buffer = io.BytesIO()
    pickler = _Capture(buffer, shared)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.tensors


def _host_offsets(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for t in tensors:
        offsets.append(end)
        end += -(-t.numel() * t.element_size() // _ALIGN_BYTES) * _ALIGN_BYTES
    return offsets, end


def state_nbytes(obj: object, shared: Mapping[str, object]) -> int:
    """The host memory a capture of `obj` takes (its tensors, aligned as `capture` lays them out)."""
    return _host_offsets(_walk(obj, shared)[1])[1]


def capture(obj: object, shared: Mapping[str, object], host_memory: HostMemory | None = None) -> StatePart:
    """`obj`'s state with every tensor copied (on its own device) and `shared` kept by name.

    With `host_memory`, a state held wholly on the CPU is copied into one buffer it gives (memory
    already touched, so the copy is the capture's whole cost: a fresh allocation of hundreds of MiB
    costs several times its copy in page faults, and more when the page cache has to make room)."""
    structure, tensors = _walk(obj, shared)
    if host_memory is None or any(t.device.type != "cpu" for t in tensors):
        return StatePart(structure, tuple(t.clone() for t in tensors))
    offsets, total = _host_offsets(tensors)
    buffer = host_memory(total)
    copies = []
    for t, at in zip(tensors, offsets, strict=True):
        view = buffer[at : at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        copies.append(view.copy_(t))
    return StatePart(structure, tuple(copies))


def restore(part: StatePart, shared: Mapping[str, object], device: torch.device) -> Any:
    """A new object equal to the captured one, its tensors fresh copies on `device`."""
    return _Restore(io.BytesIO(part.structure), part, shared, device).load()
