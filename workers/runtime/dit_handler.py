"""DiT stage handler (one rank of a Ulysses group): per session the KV cache, text K/V and camera track.

The camera is integrated here rather than in the encode stage: a chunk's control is sampled only
when the DiT is ready to start it, and turning it into poses is cheap, so the DiT never waits on
another stage for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.models.camera import CameraTrack
from workers.models.components import load_dit
from workers.models.kernels import apply_to_dit
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.parallel.ulysses import SequenceParallel
from workers.runtime.handler import StageHandler
from workers.runtime.messages import Command, DenoiseChunk, OpenSession, Reply, SessionOpened
from workers.runtime.spec import WorkerSpec
from workers.stages.denoise import DenoiseSession

LATENT_ROW_DIM = 3  # [1, 16, C, h, w]: decode ranks take bands of latent rows


@dataclass
class DitSession:
    denoise: DenoiseSession
    camera: CameraTrack


class DitHandler(StageHandler):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        self.preset = get_preset(spec.preset)
        ckpt = Path(spec.checkpoint_dir) if spec.checkpoint_dir else None
        self.dit = apply_to_dit(load_dit(self.preset, self.device, ckpt, spec.weights_seed), spec.kernels, self.device)
        self.sp = SequenceParallel(group) if group.is_multi_rank else None
        if self.sp is not None:
            self.sp.validate(self.preset.tokens_per_latent_frame, self.preset.dit.num_heads)

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank = self.spec.stage, self.spec.rank
        if isinstance(msg, OpenSession):
            assert msg.text is not None, "the DiT needs the prompt embeddings"
            text = self.take(msg.text)
            denoise = DenoiseSession(self.dit, self.preset, [text], msg.seed, msg.chunk_latent_frames, self.sp)
            self.sessions[msg.session_id] = DitSession(denoise, CameraTrack.for_preset(self.preset))
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch, acks=self.done_with(msg.text))
        elif isinstance(msg, DenoiseChunk):
            session: DitSession = self.sessions[msg.session_id]
            self.check_fault(msg.chunk_index)
            cond = self.take(msg.cond)
            with self.timed() as timer:
                if msg.reset_pose:
                    session.camera.reset_pose()
                poses = session.camera.next_poses(msg.control, session.denoise.chunk)
                # The chunk's one host-to-device copy: F 4 × 4 poses (the rays are built on the device).
                latents = session.denoise.run_chunk(cond, poses.to(self.device))
            out = self.publish(latents, shard_dim=LATENT_ROW_DIM, num_shards=self.spec.output_shards)
            yield self.chunk_done(msg, timer.busy_s, out, (msg.cond,))
        else:
            raise TypeError(f"DiT stage cannot handle {type(msg).__name__}")
