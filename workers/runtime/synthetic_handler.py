"""Stage handlers of the synthetic timing model (`workers/runtime/synthetic.py`): hold, don't compute.

Each command holds the worker for the stage's stated time, measured from when the command arrived,
and moves real tensors of the geometry preset's shapes through the real channels. The decode stage
fills its frames with their global frame numbers (`workers/frame_stamp.py`) and hands them on in
the real stage's parts, each after its share of that time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from workers.chunk_geometry import chunk_first_frame, latent_span_frames
from workers.families.registry import family_for
from workers.frame_stamp import stamp_frames
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.runtime.channel import Ack, TensorRef
from workers.runtime.handler import StageHandler
from workers.runtime.messages import (
    Command,
    DecodeChunk,
    DenoiseChunk,
    EncodeChunk,
    EncodePrompt,
    OpenSession,
    PromptEncoded,
    Reply,
    SessionOpened,
    Stage,
)
from workers.runtime.spec import WorkerSpec
from workers.stages.decode import part_bounds
from workers.stages.prompt_context import PromptContext

STAND_IN_TOKENS = 8  # the stand-in context's rows: the DiT stage only passes it on


@dataclass
class SyntheticSession:
    chunk_latent_frames: int
    # The DiT stage's prompt bookkeeping, as the real DiT keeps it (what its chunk receipts say);
    # the stand-in embeddings are one zero row.
    prompt: PromptContext
    state: torch.Tensor  # the model's `state_mib` (bytes, resident): what a snapshot copies and a save writes


class SyntheticHandler(StageHandler):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        assert spec.synthetic is not None
        self.hold_s = {
            Stage.ENCODE: spec.synthetic.encode_s,
            Stage.DIT: spec.synthetic.dit_s,
            Stage.DECODE: spec.synthetic.decode_s,
        }[spec.stage]
        self.preset = get_preset(spec.synthetic.geometry)
        self.state_bytes = int(spec.synthetic.state_mib * 2**20)

    def _hold_from(self, t0: float) -> float:
        """Sleep out the rest of the stage time since `t0`; returns the busy seconds."""
        rest = self.hold_s - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
        return time.perf_counter() - t0

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank, p = self.spec.stage, self.spec.rank, self.preset
        if isinstance(msg, OpenSession):
            acks: tuple[Ack, ...] = ()
            context = None
            if stage is Stage.ENCODE:
                context = self._stand_in_context()
            elif msg.context is not None:
                self.take(msg.context)
                acks = self.done_with(msg.context)
            # Only the DiT keeps prompt bookkeeping; the other stages keep the chunk size alone.
            if stage is Stage.DIT:
                prompt = PromptContext(msg.prompt, torch.zeros(1, 1), text_len=1)
                state = torch.ones(self.state_bytes, dtype=torch.uint8)
                self.sessions[msg.session_id] = SyntheticSession(msg.chunk_latent_frames, prompt, state)
            else:
                self.sessions[msg.session_id] = msg.chunk_latent_frames
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch, context=context, acks=acks)
            return
        if isinstance(msg, EncodePrompt):  # a text encoder's forward takes no stage time worth holding
            context = self._stand_in_context()
            assert context is not None
            yield PromptEncoded.answer(msg, stage, rank, context, 0.0)
            return
        if not isinstance(msg, EncodeChunk | DenoiseChunk | DecodeChunk):
            raise TypeError(f"synthetic stage cannot handle {type(msg).__name__}")
        t0 = time.perf_counter()
        session = self.sessions[msg.session_id]
        chunk = session.chunk_latent_frames if isinstance(session, SyntheticSession) else session
        self.check_fault(msg.chunk_index)
        if isinstance(msg, EncodeChunk):
            cond = torch.zeros(1, 20, chunk, p.latent_height, p.latent_width)
            yield self.chunk_done(msg, self._hold_from(t0), self.publish(cond))
        elif isinstance(msg, DenoiseChunk):
            self.take(msg.cond)
            assert isinstance(session, SyntheticSession)
            read: tuple[TensorRef, ...] = (msg.cond,)
            if msg.prompt is not None:
                self.take(msg.prompt.context)
                session.prompt.change(msg.prompt.text, torch.zeros(1, 1), msg.prompt.transition_chunks)
                read += (msg.prompt.context,)
            session.prompt.next_chunk()
            receipt = session.prompt.receipt() if rank == 0 and family_for(p).live_prompts else None
            latents = torch.zeros(1, 16, chunk, p.latent_height, p.latent_width)
            out = self.publish(latents, shard_dim=3, num_shards=self.spec.output_shards)
            yield self.chunk_done(msg, self._hold_from(t0), out, read, prompt=receipt)
        else:
            # Parts as the real decode stage hands them on, each after its share of the hold.
            self.take(msg.latents, shard_rank=rank)
            first = chunk_first_frame(msg.chunk_index, chunk)
            offset = 0
            bounds = part_bounds(chunk, first_in_stream=msg.chunk_index == 0)
            for i, (lo, hi) in enumerate(bounds):
                n = latent_span_frames(lo, hi, first_chunk=msg.chunk_index == 0)
                frames = torch.empty(n, p.height_px, p.width_px, 3, dtype=torch.uint8)
                stamp_frames(frames.numpy(), first + offset)
                rest = self.hold_s * hi / chunk - (time.perf_counter() - t0)
                if rest > 0:
                    time.sleep(rest)
                if rank == 0:
                    yield self.frames_ready(msg, offset, frames, last=i == len(bounds) - 1)
                offset += n
            yield self.chunk_done(msg, self._hold_from(t0), None, (msg.latents,))

    def _stand_in_context(self) -> TensorRef | None:
        """A context of the family's width, for the DiT stage to pass on."""
        p = self.preset
        return self.publish(torch.zeros(STAND_IN_TOKENS, family_for(p).context_shape(p)[1]))
