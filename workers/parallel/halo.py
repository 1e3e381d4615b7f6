"""Height sharding for spatially parallel convolution: halo exchange and row gathering.

N ranks each hold one horizontal band of the same frame: rank r owns rows [r*h/N, (r+1)*h/N) of
every tensor along the height axis (dim -2, for both [B, C, H, W] and [B, C, T, H, W]). A
convolution whose kernel spans rows needs `padding` rows from each neighbour band before it runs;
`exchange_halo` fetches them with one batched point-to-point round (both directions submitted
before any wait) and supplies zeros at the frame's global top and bottom, exactly the zero padding
an unsharded conv would have used. Operations that mix the whole frame (attention) use
`gather_rows`. Everything is torch.distributed's own P2P and collectives: gloo on CPU, NCCL on CUDA.

Every call is collective over the shard's group: all ranks must make the same sequence of calls
with same-shaped bands (each rank's band has the same height), or the exchange hangs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workers.parallel.group import StageGroup

__all__ = ["SpatialShard", "split_rows"]


def split_rows(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s band of `x` along the height axis (dim -2): the r-th of `world_size` equal bands.

    Returns a view. Raises ValueError if the height does not divide by `world_size`.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    if x.ndim < 2:
        raise ValueError(f"need a tensor with a height axis (dim -2), got shape {tuple(x.shape)}")
    h = x.shape[-2]
    if h % world_size:
        raise ValueError(f"height {h} (rows) does not divide into {world_size} equal bands")
    band = h // world_size
    return x.narrow(-2, rank * band, band)


@dataclass(frozen=True)
class SpatialShard:
    """This rank's place in a height-sharded computation: band `rank` of `world_size` over `group`.

    `world_size == 1` is legal and communicates nothing (halos are all zeros, gathers are identity),
    which makes it a cheap way to exercise the sharded code path on one process.
    """

    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None  # None: the default group

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside 0..{self.world_size - 1}")

    @classmethod
    def from_group(cls, group: StageGroup) -> SpatialShard:
        return cls(rank=group.rank, world_size=group.world_size, group=group.group)

    @property
    def is_top(self) -> bool:
        return self.rank == 0

    @property
    def is_bottom(self) -> bool:
        return self.rank == self.world_size - 1

    def _global(self, group_rank: int) -> int:
        """Group rank -> global rank (what torch's P2P and gather `dst` arguments take)."""
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    # ------------------------------------------------------------------------------------- halo

    def exchange_halo(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """`x` with `rows` neighbour rows added above and below along dim -2.

        The rows above come from the bottom of rank-1's band, the rows below from the top of
        rank+1's band; at the global top and bottom edges they are zeros. Output height is
        h_local + 2*rows. Collective: every rank of the group must call it with the same `rows`.
        """
        if rows < 0:
            raise ValueError(f"halo rows must be >= 0, got {rows}")
        if rows == 0:
            return x
        h = x.shape[-2]
        if rows > h:
            raise ValueError(f"halo of {rows} rows is taller than the local band ({h} rows)")
        halo_shape = (*x.shape[:-2], rows, x.shape[-1])
        top = torch.zeros(halo_shape, dtype=x.dtype, device=x.device)
        bottom = torch.zeros(halo_shape, dtype=x.dtype, device=x.device)
        ops: list[dist.P2POp] = []
        if not self.is_top:
            up = self._global(self.rank - 1)
            ops.append(dist.P2POp(dist.isend, x[..., :rows, :].contiguous(), up, self.group))
            ops.append(dist.P2POp(dist.irecv, top, up, self.group))
        if not self.is_bottom:
            down = self._global(self.rank + 1)
            ops.append(dist.P2POp(dist.isend, x[..., h - rows :, :].contiguous(), down, self.group))
            ops.append(dist.P2POp(dist.irecv, bottom, down, self.group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return torch.cat([top, x, bottom], dim=-2)

    # ------------------------------------------------------------------------------------- gather

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The whole frame on every rank: all bands concatenated along dim -2 in rank order."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-2)

    def gather_rows_to(self, x: torch.Tensor, dst: int) -> torch.Tensor | None:
        """The whole frame on group rank `dst` (None on the other ranks)."""
        if not 0 <= dst < self.world_size:
            raise ValueError(f"gather destination {dst} outside 0..{self.world_size - 1}")
        if self.world_size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == dst else None
        dist.gather(x, parts, dst=self._global(dst), group=self.group)
        return torch.cat(parts, dim=-2) if parts is not None else None

    def check_uniform(self, values: Sequence[int], what: str, device: torch.device) -> None:
        """Raise ValueError on every rank unless all ranks passed the same `values`.

        One small all_gather; turns a mismatched band (which would hang or garble the halo
        exchange) into the same clear error on all ranks.
        """
        if self.world_size == 1:
            return
        mine = torch.tensor(list(values), dtype=torch.int64, device=device)
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.group)
        seen = [tuple(int(v) for v in p.tolist()) for p in parts]
        if any(s != seen[0] for s in seen):
            raise ValueError(f"ranks disagree on {what}: {dict(enumerate(seen))}")
