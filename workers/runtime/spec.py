"""What a stage worker process is told at spawn: its stage, rank, device, model and faults to inject."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from workers.determinism import DEFAULT_CPU_THREADS
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig
from workers.models.savings import NO_SAVINGS, Savings
from workers.runtime.messages import Stage
from workers.runtime.synthetic import SyntheticModel


@dataclass(frozen=True)
class FaultSpec:
    """Injected faults for tests of the runtime: random delays before each chunk, and/or raising at a chunk."""

    chunk_index: int | None = None  # raise the first time this chunk is reached
    message: str = "injected fault"
    max_delay_s: float = 0.0  # sleep uniformly in [0, max_delay_s) before each chunk
    seed: int = 0


@dataclass(frozen=True)
class WorkerSpec:
    stage: Stage
    rank: int
    world_size: int
    device: str
    preset: str
    checkpoint_dir: str | None
    weights_seed: int
    parent_pid: int
    dist_init: str | None = None  # rendezvous for multi-rank stages, e.g. "file:///tmp/…"
    cpu_threads: int = DEFAULT_CPU_THREADS
    output_shards: int = 1  # consumer ranks of this stage's output (decode ranks for the DiT's latents)
    kernels: KernelConfig = DEFAULT_KERNELS  # attention backend, compile, deterministic
    savings: Savings = NO_SAVINGS  # memory savings: fp8 DiT weights, VAE dtype and bands, context encoder on the host
    frame_ring_slots: int = 4  # decode: chunks of uint8 frames the server may hold at once
    synthetic: SyntheticModel | None = None  # hold for fixed times instead of computing
    fault: FaultSpec | None = None

    @property
    def name(self) -> str:
        return f"{self.stage.value}[{self.rank}/{self.world_size}]"

    def with_rendezvous(self, dist_init: str) -> WorkerSpec:
        return dataclasses.replace(self, dist_init=dist_init)
