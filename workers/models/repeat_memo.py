"""Skip a stream layer whose inputs repeat: the exact shortcut behind the condition encode's warm-up.

The image condition (workers/stages/condition.py) encodes the start image and then black frames
forever. Layer by layer, the VAE encoder's inputs become the same from one call to the next: the
full-resolution layers after two or three latent frames, the deeper ones (which see the image
through longer causal histories) only after about 26. Until the last of them settles, the stream
runs the whole encoder on every chunk, although most of its layers, and nearly all of its
arithmetic, repeat the previous call bit for bit.

`RepeatMemo` keeps, per layer, the tensors the layer read on its last call (its input and the
causal-cache frames it was handed) and what it returned. When every one of them is bitwise equal
to this call's, the layer would compute the same output from the same numbers, and its caches
would take the same tails they already hold, so the memo returns the kept output and the layer does
not run. That is exact by construction: a deterministic kernel on identical inputs.

It costs a reference to each layer's last input and output per stream (tensors the layer made
anyway, kept alive a call longer), and a bitwise comparison per layer per call, which reads the
input once: a small fraction of any convolution over it. The kept tensors are bounded by
`max_bytes`: past it, a layer's call is not kept and runs every time, so a large frame size keeps
the memo to its first layers' worth. A stream opts in (`VAEStreamState.encoder_memo`); the
condition encode does on the CPU, where the warm-up's compute competes with the live stages for the
same cores, and the memory plan counts what it keeps (workers/runtime/footprint.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Call:
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.inputs, self.output)


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x is y
        # A trace on `meta` (the memory plan) has no values to compare: it never repeats.
        or (x.device.type != "meta" and x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class RepeatMemo:
    """Per layer (keyed by the caller), the last call's inputs and output, within `max_bytes`; see
    the module docstring.

    The kept tensors must not be written in place afterwards: the stream's caches are replaced, never
    written into, and the encoder's layers return fresh tensors.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._calls: dict[int, _Call] = {}
        self.hits = 0
        self.misses = 0

    def __getstate__(self) -> dict[str, object]:
        # A snapshot keeps the stream's caches, not this: a restored stream refills it on its next
        # calls (keys are module ids, which another process would not share anyway).
        return {"max_bytes": self.max_bytes, "_calls": {}, "hits": self.hits, "misses": self.misses}

    def kept(self) -> list[torch.Tensor]:
        """Every tensor the memo holds, each once (a layer's output is often the next one's input)."""
        unique = {id(t): t for call in self._calls.values() for t in call.tensors}
        return list(unique.values())

    def run(self, key: int, inputs: tuple[torch.Tensor, ...], layer: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`layer()` unless `inputs` equal the last call's under `key`; then that call's output."""
        last = self._calls.pop(key, None)
        if last is not None and _same(last.inputs, inputs):
            self.hits += 1
            self._calls[key] = last
            return last.output
        self.misses += 1
        output = layer()
        call = _Call(inputs, output)
        # Counted without sharing between layers: the bound holds whatever the overlap.
        if _nbytes(call.tensors) + sum(_nbytes(c.tensors) for c in self._calls.values()) <= self.max_bytes:
            self._calls[key] = call
        return output
