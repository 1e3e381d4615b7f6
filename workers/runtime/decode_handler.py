"""Decode stage handler (one rank of a height-sharded group): latents in, uint8 frames to the server.

Each rank reads only its band of latent rows from the DiT's slot; rank 0 gathers the frames and
publishes them into host shared memory (the frame ring) for the server to copy out, part by part
as they are decoded (`FramesReady`), then reports the chunk done.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from workers.models.components import load_vae
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.parallel.halo import SpatialShard
from workers.runtime.handler import StageHandler
from workers.runtime.messages import Command, DecodeChunk, OpenSession, Reply, SessionOpened
from workers.runtime.spec import WorkerSpec
from workers.stages.decode import DecodeSession


class DecodeHandler(StageHandler):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        self.preset = get_preset(spec.preset)
        ckpt = Path(spec.checkpoint_dir) if spec.checkpoint_dir else None
        self.vae = load_vae(self.preset, self.device, ckpt, spec.weights_seed, spec.savings)
        self.shard = SpatialShard.from_group(group) if group.is_multi_rank else None

    def shared_state(self) -> dict[str, object]:
        return {"vae": self.vae, "shard": self.shard}

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank = self.spec.stage, self.spec.rank
        if isinstance(msg, OpenSession):
            self.sessions[msg.session_id] = DecodeSession(self.vae, self.shard)
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch)
        elif isinstance(msg, DecodeChunk):
            session: DecodeSession = self.sessions[msg.session_id]
            self.check_fault(msg.chunk_index)
            band = self.take(msg.latents, shard_rank=rank if self.shard else None)
            busy_s = 0.0
            offset = 0
            # A chunk's first frames go ahead of the rest only while this stage decodes for one
            # session: with two sharing a saturated decode (2 CPU cores), JIT dispatch timed
            # chunks by their early first frames and their later frames missed the pacer more
            # (responsive preset, two viewers: 13.5-15.0 unique FPS each over three runs, against
            # 14.4-15.7 over six with the parts together). The frames are the same either way.
            parts = session.run_chunk_parts(band, first_frames_early=len(self.sessions) == 1)
            while True:
                # Busy time counts the decoding only, not the hand-off of each part.
                with self.timed() as timer:
                    part = next(parts, None)
                busy_s += timer.busy_s
                if part is None:
                    break
                frames, last = part
                if frames is not None:  # rank 0: hand the part on at once
                    yield self.frames_ready(msg, offset, torch.from_numpy(frames), last)
                    offset += len(frames)
            yield self.chunk_done(msg, busy_s, None, (msg.latents,))
        else:
            raise TypeError(f"decode stage cannot handle {type(msg).__name__}")
