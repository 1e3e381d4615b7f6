"""Nothing crosses between host and device inside a DiT step.

The step (`DenoiseSession.run_chunk`: the sampling forwards and the commit forward) runs under a
dispatch mode that sees every aten op. It fails on any op that touches a tensor off the stage's
device (a host->device copy, a device->host copy, a host tensor mixed into a device op, a table
built on the host) and on any op that reads a value back to Python (`.item()`, `.tolist()`,
`bool(t)`, `torch.equal`), each of which would stall a CUDA stream.

On a CPU-only machine the stage's device is `meta`: the step runs with shapes and no data, so a
host tensor is as foreign to it as to a GPU, and a value read fails loudly. With CUDA the same
check runs on the real device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workers.models.components import load_dit
from workers.models.dit import WanDiT
from workers.models.loading import build_on_meta
from workers.models.presets import get_preset
from workers.stages.denoise import DenoiseSession

# Ops whose whole purpose is to hand a device value to the host.
SCALAR_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.item.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
}


class HostCrossing(AssertionError):
    pass


def _indexed(device: torch.device) -> torch.device:
    """ "cuda" -> "cuda:N" (the current device), as tensors report their device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class HostCrossingWatch(TorchDispatchMode):
    """Raises on the first op that crosses between the host and `device` (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = _indexed(device)
        self.ops = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        if func in SCALAR_READS:
            raise HostCrossing(f"{func} reads a device value on the host")
        self._check(func, "input", tree_leaves((args, kwargs)))
        target = kwargs.get("device")
        if target is not None and _indexed(torch.device(target)) != self.device:
            raise HostCrossing(f"{func} moves or creates a tensor on {target}, not {self.device}")
        out = func(*args, **kwargs)
        self._check(func, "output", tree_leaves(out))
        if isinstance(out, bool | int | float | complex):
            raise HostCrossing(f"{func} returned a Python {type(out).__name__} from device tensors")
        return out

    def _check(self, func: Any, role: str, leaves: list[Any]) -> None:
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and leaf.device != self.device:
                shape = list(leaf.shape)
                raise HostCrossing(f"{func}: {role} tensor on {leaf.device}, shape {shape}, not {self.device}")


def _session(device: torch.device, preset_name: str = "tiny") -> tuple[DenoiseSession, torch.Tensor, torch.Tensor]:
    preset = get_preset(preset_name)
    # On meta the DiT has shapes and no weights: the step's op stream is all this test reads.
    meta = device.type == "meta"
    dit = build_on_meta(lambda: WanDiT(preset.dit)).eval() if meta else load_dit(preset, device, None)
    chunk = preset.chunk_latent_frames
    text = torch.zeros(7, preset.dit.text_dim, device=device)
    session = DenoiseSession(dit, preset, text, seed=0, chunk_latent_frames=chunk)
    cond = torch.zeros(1, 20, chunk, preset.latent_height, preset.latent_width, device=device)
    poses = torch.eye(4, dtype=torch.float64, device=device).repeat(chunk, 1, 1)
    return session, cond, poses


def _devices() -> list[Any]:
    cuda = pytest.param(torch.device("cuda"), marks=pytest.mark.gpu, id="cuda")
    return [pytest.param(torch.device("meta"), id="meta"), cuda]


@pytest.mark.heavy
@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("preset", ["tiny", "gridworld"])
def test_a_dit_step_neither_copies_from_the_host_nor_reads_back(device: torch.device, preset: str) -> None:
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    session, cond, poses = _session(device, preset)
    for chunk in range(3):  # the first chunk, one with history, one past the window's first roll
        watch = HostCrossingWatch(device)
        with watch:
            latents = session.run_chunk(cond, poses)
        assert latents.device == _indexed(device) and latents.shape == (1, 16, *cond.shape[2:])
        assert watch.ops > 100, "the step ran under the watch"
        assert session.kv_cache.committed_frames == (chunk + 1) * session.chunk


@pytest.mark.parametrize(
    "crossing",
    [
        pytest.param(lambda x: x.sum().item(), id="item"),
        pytest.param(lambda x: x.tolist(), id="tolist"),
        pytest.param(lambda x: x.cpu(), id="cpu"),
        pytest.param(lambda x: bool((x > 0).any()), id="bool"),
        pytest.param(lambda x: x + torch.ones(x.shape[-1]).to(x.device), id="host-to-device"),
        pytest.param(lambda x: x * torch.tensor(2.0), id="host-scalar"),
        pytest.param(lambda x: torch.equal(x, x), id="equal"),
    ],
)
def test_the_watch_catches_each_kind_of_crossing(crossing: Callable[[torch.Tensor], object]) -> None:
    x = torch.zeros(2, 3, device="meta")
    with pytest.raises(HostCrossing), HostCrossingWatch(x.device):
        crossing(x)
