"""Encode stage handler: per session, the start image's VAE condition stream, and the context its
family's encoder makes (the prompt's umT5 embeddings, or Matrix-Game's CLIP image tokens): once at
the start, and again for each prompt the driver types while walking (ahead of the chunk work here,
so the DiT, which takes it with its next chunk, never waits on the text encoder)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from workers.families.registry import family_for
from workers.images import to_model_range
from workers.models.components import load_vae
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.runtime.handler import StageHandler
from workers.runtime.messages import (
    Command,
    EncodeChunk,
    EncodePrompt,
    OpenSession,
    PromptEncoded,
    Reply,
    SessionOpened,
)
from workers.runtime.spec import WorkerSpec
from workers.stages.condition import ImageConditionStream


class EncodeHandler(StageHandler):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        self.preset = get_preset(spec.preset)
        ckpt = Path(spec.checkpoint_dir) if spec.checkpoint_dir else None
        self.vae = load_vae(self.preset, self.device, ckpt, spec.weights_seed, spec.savings)
        family = family_for(self.preset)
        # The slot publish copies a context made on the host (--text-encoder-on-cpu) to this device.
        self.context_encoder = family.load_context_encoder_with(
            self.preset, self.device, ckpt, spec.weights_seed, spec.savings
        )

    def shared_state(self) -> dict[str, object]:
        return {"vae": self.vae, "context_encoder": self.context_encoder}

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank = self.spec.stage, self.spec.rank
        if isinstance(msg, OpenSession):
            assert msg.image is not None, "encode needs the start image"
            image = to_model_range(msg.image)
            context = self.context_encoder.encode(image, msg.prompt)
            self.sessions[msg.session_id] = ImageConditionStream(self.vae, image, self.preset, msg.chunk_latent_frames)
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch, context=self.publish(context))
        elif isinstance(msg, EncodeChunk):
            stream: ImageConditionStream = self.sessions[msg.session_id]
            self.check_fault(msg.chunk_index)
            with self.timed() as timer:
                cond = stream.next_chunk()
            yield self.chunk_done(msg, timer.busy_s, self.publish(cond))
        elif isinstance(msg, EncodePrompt):
            with self.timed() as timer:
                context = self.context_encoder.encode_prompt(msg.text)
            ref = self.publish(context)
            assert ref is not None, "the encode stage publishes to the DiT"
            yield PromptEncoded.answer(msg, stage, rank, ref, timer.busy_s)
        else:
            raise TypeError(f"encode stage cannot handle {type(msg).__name__}")
