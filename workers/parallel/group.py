"""A stage's torch.distributed group: which rank this process is, and how many share the stage.

NCCL on CUDA, gloo on CPU. Each multi-rank stage owns one default process group for its own ranks
(stages run in separate processes, so they never share a group). Collectives are torch's own;
nothing here re-implements them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StageGroup:
    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None  # None: the default group

    @property
    def is_multi_rank(self) -> bool:
        return self.world_size > 1


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_stage_group(
    init_method: str, rank: int, world_size: int, device: torch.device, timeout_s: float = 60.0
) -> StageGroup:
    """Join the stage's group (a no-op for a single rank). `init_method`: e.g. 'file:///tmp/x' or 'tcp://127.0.0.1:P'."""
    if world_size == 1:
        return StageGroup(rank=0, world_size=1)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    dist.init_process_group(
        backend_for(device),
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return StageGroup(rank=rank, world_size=world_size)


def destroy_stage_group(group: StageGroup) -> None:
    if group.is_multi_rank and dist.is_initialized():
        dist.destroy_process_group()
