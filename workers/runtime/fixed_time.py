"""Benchmark stages that hold their worker for a fixed time instead of computing.

They move real tensors of the real shapes through the real channels, so `benchmarks.pipeline`
measures the runtime's own overhead (scheduling, messages, slot copies) against the ideal
pipelined and serial bounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.runtime.messages import (
    Command,
    DecodeChunk,
    DenoiseChunk,
    EncodeChunk,
    OpenSession,
    Reply,
    SessionOpened,
    Stage,
)
from workers.runtime.servers import StageServer
from workers.runtime.worker import WorkerSpec


class FixedTimeServer(StageServer):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        assert spec.fixed_stage_s is not None
        self.hold_s = spec.fixed_stage_s
        self.preset = get_preset(spec.preset)

    def _hold(self) -> float:
        t0 = time.perf_counter()
        time.sleep(self.hold_s)
        return time.perf_counter() - t0

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank, p = self.spec.stage, self.spec.rank, self.preset
        if isinstance(msg, OpenSession):
            acks = ()
            text = None
            if stage is Stage.ENCODE:
                text = self.publish(torch.zeros(8, p.t5.dim))
            elif msg.text is not None:
                self.take(msg.text)
                acks = self.done_with(msg.text)
            self.sessions[msg.session_id] = msg.chunk_latent_frames
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch, text=text, acks=acks)
            return
        chunk = self.sessions[msg.session_id]
        self.check_fault(msg.chunk_index)
        if isinstance(msg, EncodeChunk):
            busy = self._hold()
            yield self.chunk_done(msg, busy, self.publish(torch.zeros(1, 20, chunk, p.latent_height, p.latent_width)))
        elif isinstance(msg, DenoiseChunk):
            self.take(msg.cond)
            busy = self._hold()
            latents = torch.zeros(1, 16, chunk, p.latent_height, p.latent_width)
            out = self.publish(latents, shard_dim=3, num_shards=self.spec.output_shards)
            yield self.chunk_done(msg, busy, out, (msg.cond,))
        elif isinstance(msg, DecodeChunk):
            self.take(msg.latents, shard_rank=rank)
            busy = self._hold()
            frames = 4 * chunk - 3 if msg.chunk_index == 0 else 4 * chunk
            out = self.publish(torch.zeros(frames, p.height_px, p.width_px, 3, dtype=torch.uint8))
            yield self.chunk_done(msg, busy, out, (msg.latents,))
        else:
            raise TypeError(f"fixed-time stage cannot handle {type(msg).__name__}")
