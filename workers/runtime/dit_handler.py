"""DiT stage handler (one rank of a Ulysses group): per session the family's denoise session (its
caches and context K/V) and control track.

The control is folded in here rather than in the encode stage: a chunk's control is sampled only
when the DiT is ready to start it, and turning it into model input (poses, action windows) is
cheap, so the DiT never waits on another stage for it.

A chunk's reply goes out as soon as its latents are sampled, so the decode starts a forward
earlier; its commit forward (the clean K/V for the session's next chunk) runs after it and ends the
command (`ChunkCommitted`): the scheduler gives the stage nothing else, and so samples no other
chunk's controls, before that.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.families.family import ChunkDenoiser, ControlTrack
from workers.families.registry import family_for
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.parallel.ulysses import SequenceParallel
from workers.runtime.channel import TensorRef
from workers.runtime.handler import StageHandler
from workers.runtime.messages import (
    ChunkCommitted,
    Command,
    DenoiseChunk,
    OpenSession,
    Reply,
    SessionOpened,
    raised,
)
from workers.runtime.spec import WorkerSpec

LATENT_ROW_DIM = 3  # [1, 16, C, h, w]: decode ranks take bands of latent rows


@dataclass
class DitSession:
    denoise: ChunkDenoiser
    control: ControlTrack


class DitHandler(StageHandler):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        self.preset = get_preset(spec.preset)
        ckpt = Path(spec.checkpoint_dir) if spec.checkpoint_dir else None
        self.family = family_for(self.preset)
        self.dit = self.family.load_dit_with(
            self.preset, self.device, ckpt, spec.weights_seed, spec.kernels, spec.savings
        )
        self.sp = SequenceParallel(group) if group.is_multi_rank else None
        if self.sp is not None:
            self.sp.validate(self.preset.tokens_per_latent_frame, self.preset.dit.num_heads)

    def shared_state(self) -> dict[str, object]:
        return {"dit": self.dit, "sp": self.sp}

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank = self.spec.stage, self.spec.rank
        if isinstance(msg, OpenSession):
            assert msg.context is not None, "the DiT needs the session's context"
            context = self.take(msg.context)
            p = self.preset
            denoise = self.family.open_denoise(
                self.dit, p, context, msg.seed, msg.chunk_latent_frames, self.sp, prompt=msg.prompt
            )
            self.sessions[msg.session_id] = DitSession(denoise, self.family.control_track(p))
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch, acks=self.done_with(msg.context))
        elif isinstance(msg, DenoiseChunk):
            session: DitSession = self.sessions[msg.session_id]
            self.check_fault(msg.chunk_index)
            # A copy: the reply hands the slot back before the commit forward reads it again.
            cond = self.take(msg.cond).clone()
            read: tuple[TensorRef, ...] = (msg.cond,)
            if msg.prompt is not None:  # from this chunk on (the denoise session copies the context)
                change = msg.prompt
                session.denoise.change_prompt(self.take(change.context), change.text, change.transition_chunks)
                read += (change.context,)
            with self.timed() as timer:
                if msg.reset_pose:
                    session.control.reset_pose()
                inputs = session.control.next_inputs(msg.control, session.denoise.chunk)
                # The chunk's one host-to-device copy: F 4 × 4 poses (the rays are built on the device),
                # or the action windows.
                latents = session.denoise.sample_chunk(cond, inputs.to(self.device))
            out = self.publish(latents, shard_dim=LATENT_ROW_DIM, num_shards=self.spec.output_shards)
            described = self.family.describe_inputs(inputs) if rank == 0 else None
            receipt = session.denoise.prompt_receipt() if rank == 0 else None
            yield self.chunk_done(msg, timer.busy_s, out, read, described, receipt, commit_follows=True)
            yield self._commit(msg, session)
        else:
            raise TypeError(f"DiT stage cannot handle {type(msg).__name__}")

    def _commit(self, msg: DenoiseChunk, session: DitSession) -> ChunkCommitted:
        stage, rank = self.spec.stage, self.spec.rank
        chunk = (stage, rank, msg.session_id, msg.epoch, msg.chunk_index)
        try:
            with self.timed() as timer:
                session.denoise.commit_chunk()
        except Exception as exc:
            if self.group.is_multi_rank:
                raise  # its peers may be mid-collective: the worker fails fatally (workers/runtime/worker.py)
            # The caches may hold part of the chunk: the session cannot go on, and its chunk was answered.
            self.drop_session(msg.session_id)
            return ChunkCommitted(*chunk, 0.0, raised(stage, rank, exc))
        return ChunkCommitted(*chunk, timer.busy_s)
