"""Encode stage handler: per session, the start image's VAE condition stream and the prompt's embeddings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from workers.images import to_model_range
from workers.models.components import load_text_encoder, load_vae
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.runtime.handler import StageHandler
from workers.runtime.messages import Command, EncodeChunk, OpenSession, Reply, SessionOpened
from workers.runtime.spec import WorkerSpec
from workers.stages.condition import ImageConditionStream, encode_prompt


class EncodeHandler(StageHandler):
    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        super().__init__(spec, group)
        self.preset = get_preset(spec.preset)
        ckpt = Path(spec.checkpoint_dir) if spec.checkpoint_dir else None
        self.vae = load_vae(self.preset, self.device, ckpt, weights_seed=spec.weights_seed)
        self.text_encoder = load_text_encoder(self.preset, self.device, ckpt, weights_seed=spec.weights_seed)

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        stage, rank = self.spec.stage, self.spec.rank
        if isinstance(msg, OpenSession):
            assert msg.image is not None, "encode needs the start image"
            with torch.no_grad():
                text = encode_prompt(self.text_encoder, msg.prompt)[0]
            image = to_model_range(msg.image)
            self.sessions[msg.session_id] = ImageConditionStream(self.vae, image, self.preset, msg.chunk_latent_frames)
            yield SessionOpened(stage, rank, msg.session_id, msg.epoch, text=self.publish(text))
        elif isinstance(msg, EncodeChunk):
            stream: ImageConditionStream = self.sessions[msg.session_id]
            self.check_fault(msg.chunk_index)
            with self.timed() as timer:
                cond = stream.next_chunk()
            yield self.chunk_done(msg, timer.busy_s, self.publish(cond))
        else:
            raise TypeError(f"encode stage cannot handle {type(msg).__name__}")
