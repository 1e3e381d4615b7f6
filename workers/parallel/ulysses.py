"""Ulysses sequence parallelism for the DiT: shard tokens across a stage group, swap to heads for attention.

Every rank of the group receives the full chunk inputs. After embedding, rank r keeps tokens
[r·S/N, (r+1)·S/N) of every frame (S tokens per frame, N ranks), so all per-token work
(modulation, camera, cross-attention, FFN, head) runs on 1/N of the tokens. Self-attention needs
every token, so it swaps the split: an all-to-all turns (local tokens × all heads) into (all tokens
× heads [r·H/N, (r+1)·H/N)), attention runs per head as usual (the KV cache holds only those
heads), and a second all-to-all swaps back. The head output is gathered at the end so every rank
returns the full velocity: the sampler runs identically on all ranks.

Only torch collectives are used (all_to_all_single, all_gather), so the same code runs on NCCL
(CUDA) and gloo (CPU tests).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workers.parallel.group import StageGroup


class SequenceParallel:
    """The shard/unshard/all-to-all helpers of one Ulysses group (wraps the stage's StageGroup)."""

    def __init__(self, group: StageGroup) -> None:
        self.stage = group
        self.rank = group.rank
        self.world_size = group.world_size
        self.group = group.group  # None: the default process group

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def validate(self, tokens_per_frame: int, num_heads: int) -> None:
        """Both the per-frame token split and the head split must be even across the ranks."""
        n = self.world_size
        if tokens_per_frame % n:
            raise ValueError(
                f"Ulysses sequence parallelism over {n} ranks needs tokens per frame divisible by {n}; "
                f"got {tokens_per_frame} tokens per frame"
            )
        if num_heads % n:
            raise ValueError(
                f"Ulysses sequence parallelism over {n} ranks needs attention heads divisible by {n}; "
                f"got {num_heads} heads"
            )

    # ---- token sharding ----

    def shard_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """[B, F, S, ...] -> this rank's [B, F, S/N, ...] (a contiguous copy)."""
        s = x.shape[2] // self.world_size
        return x[:, :, self.rank * s : (self.rank + 1) * s].contiguous()

    def gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's [B, F, S/N, C] -> the full [B, F, S, C] on every rank."""
        x = x.contiguous()
        out = x.new_empty((self.world_size, *x.shape))  # [N, B, F, S/N, C]
        dist.all_gather(list(out.unbind(0)), x, group=self.group)
        return out.permute(1, 2, 0, 3, 4).flatten(2, 3)  # [B, F, N·S/N, C]

    # ---- the two all-to-alls around self-attention ----

    def tokens_to_heads(self, *xs: torch.Tensor) -> list[torch.Tensor]:
        """Each [B, F, S/N, H, D] (local tokens, all heads) -> [B, F·S, H/N, D] (all tokens, local heads).

        Tokens come back in frame-major (f, h, w) order, as in the single-rank sequence. The
        tensors are independent, so all their all-to-alls are submitted before waiting on any.
        """
        n = self.world_size
        pending = []
        for x in xs:
            b, f, s, h, d = x.shape
            # Dim 0 is the destination rank: rank j receives heads [j·H/N, (j+1)·H/N).
            send = x.view(b, f, s, n, h // n, d).permute(3, 0, 1, 2, 4, 5).contiguous()  # [N, B, F, S/N, H/N, D]
            recv = torch.empty_like(send)  # dim 0 becomes the source rank, i.e. the token shard
            work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
            pending.append((work, recv))
        out = []
        for work, recv in pending:
            work.wait()
            _, b, f, s, hn, d = recv.shape
            out.append(recv.permute(1, 2, 0, 3, 4, 5).reshape(b, f * n * s, hn, d))  # [B, F·S, H/N, D]
        return out

    def heads_to_tokens(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        """[B, F·S, H/N, D] (all tokens, local heads) -> [B, F, S/N, H·D] (local tokens, all heads)."""
        n = self.world_size
        b, length, hn, d = x.shape
        s = length // (frames * n)
        # Dim 0 is the destination rank: rank j receives its token shard of every frame.
        send = x.reshape(b, frames, n, s, hn, d).permute(2, 0, 1, 3, 4, 5).contiguous()  # [N, B, F, S/N, H/N, D]
        recv = torch.empty_like(send)  # dim 0 becomes the source rank, i.e. the head block
        dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 2, 3, 0, 4, 5).reshape(b, frames, s, n * hn * d)  # heads in rank order
