"""Peak bytes of the tensors an operation allocates, found by running it on the `meta` device.

A module built on `meta` runs its forward with shapes and no data, so a full-size model (the 14B
DiT at 480 × 832, the Wan VAE) can be traced on any machine in a second. `LiveBytes` is a dispatch
mode that watches every op's outputs: a new storage counts from the op that creates it until the
last tensor viewing it is gone (with no autograd graph, Python's reference counting frees
intermediates exactly when the device allocator would). Its `peak_bytes` is what the traced call
needs on top of what existed before it (weights, caches): the activations a memory plan adds.

It measures live tensors, as `torch.cuda.max_memory_allocated` does; the caching allocator's
rounding and fragmentation come on top (the plan adds a margin for them).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LiveBytes(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing is compiled under this mode, so torch's guard around each dispatch (against
        # compiling inside it) only costs: a Python frame per op, and on the first op the import of
        # torch._dynamo, seconds of a server's start.
        return False

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, int] = {}  # storage id -> live tracked tensors viewing it
        self._sizes: dict[int, int] = {}
        # id of each tracked tensor -> a weak reference whose callback releases it (tensors compare
        # by value, so they cannot be kept in a set)
        self._tracked: dict[int, weakref.ref[torch.Tensor]] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, tuple | list) else (out,)
        inputs: set[int] | None = None
        for t in outputs:
            if isinstance(t, torch.Tensor) and id(t) not in self._tracked:
                key = _key(t)
                if key not in self._refs:
                    if inputs is None:
                        inputs = {_key(a) for a in _tensors(args, kwargs)}
                    if key in inputs:
                        continue  # a view of a tensor from before the trace: nothing new
                    self._allocate(key, t.untyped_storage().nbytes())
                self._refs[key] += 1
                self._tracked[id(t)] = weakref.ref(t, self._releaser(key, id(t)))
        return out

    def _allocate(self, key: int, nbytes: int) -> None:
        self._sizes[key] = nbytes
        self._refs[key] = 0
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _releaser(self, key: int, tensor_id: int) -> Callable[[weakref.ref[torch.Tensor]], None]:
        return lambda _: self._release(key, tensor_id)

    def _release(self, key: int, tensor_id: int) -> None:
        self._tracked.pop(tensor_id, None)
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self.live_bytes -= self._sizes.pop(key)


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[torch.Tensor]:
    """Tensor arguments, including those inside lists (cat, stack): aten ops nest no deeper."""
    found = []
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, list | tuple):
            found += [x for x in a if isinstance(x, torch.Tensor)]
    return found


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)
