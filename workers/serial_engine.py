"""The serial reference engine: all three stages in one process, one chunk at a time.

It is the correctness reference for the multi-process runtime: same seed, image, prompt and
controls must give the same frames there, at the same intra-op thread count (see
`workers/determinism.py`). Model code runs at `cpu_threads` torch threads (default: the `cpu`
placement's count per worker), whatever the calling process uses otherwise. Usage:

    engine = SerialEngine.load("tiny")
    session = engine.create_session(image, prompt="a walk", seed=0)
    chunk = session.step(ChunkControl.from_keys(["w"]))   # chunk.frames: [T, H, W, 3] uint8
    saved = engine.snapshot(session)                      # the whole generation state, on the host
    branch = engine.branch(saved)                         # steps on from there, bit for bit
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.controls import ChunkControl
from workers.determinism import DEFAULT_CPU_THREADS, intra_op_threads
from workers.families.family import ChunkDenoiser, ContextEncoder, ControlTrack, ModelFamily
from workers.families.registry import family_for
from workers.images import fit_image, read_image, to_model_range
from workers.models.checkpoint_files import require_checkpoint
from workers.models.components import load_vae
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig, apply_to_process
from workers.models.presets import ModelPreset, get_preset
from workers.models.savings import NO_SAVINGS, Savings
from workers.models.vae import WanVAE
from workers.session_state import StatePart, capture, restore
from workers.stages.condition import ImageConditionStream
from workers.stages.decode import DecodeSession


@dataclass(frozen=True)
class StageTimings:
    encode_s: float
    denoise_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.encode_s + self.denoise_s + self.decode_s


@dataclass(frozen=True)
class ChunkResult:
    index: int
    frames: np.ndarray  # [T, H, W, 3] uint8
    latents: torch.Tensor  # [1, 16, C, h, w] float32 on CPU
    first_frame_index: int  # index of frames[0] in the session's video
    control: ChunkControl
    timings: StageTimings
    prompt: dict[str, Any] | None = None  # the prompt the chunk's DiT read (ChunkDenoiser.prompt_receipt)


@dataclass
class SerialSession:
    preset: ModelPreset
    chunk_latent_frames: int
    condition: ImageConditionStream
    control: ControlTrack
    denoise: ChunkDenoiser
    decode: DecodeSession
    cpu_threads: int
    chunks_done: int = 0
    frames_done: int = 0
    closed: bool = field(default=False)

    def step(self, control: ChunkControl) -> ChunkResult:
        if self.closed:
            raise RuntimeError("session is closed")
        with intra_op_threads(self.cpu_threads):
            t0 = time.perf_counter()
            cond = self.condition.next_chunk()
            inputs = self.control.next_inputs(control, self.chunk_latent_frames)
            t1 = time.perf_counter()
            latents = self.denoise.run_chunk(cond.to(self.denoise.device), inputs.to(self.denoise.device))
            t2 = time.perf_counter()
            frames = self.decode.run_chunk(latents)
            t3 = time.perf_counter()
        assert frames is not None  # one process decodes the whole frame
        result = ChunkResult(
            index=self.chunks_done,
            frames=frames,
            latents=latents.cpu(),
            first_frame_index=self.frames_done,
            control=control,
            timings=StageTimings(encode_s=t1 - t0, denoise_s=t2 - t1, decode_s=t3 - t2),
            prompt=self.denoise.prompt_receipt(),
        )
        self.chunks_done += 1
        self.frames_done += len(frames)
        return result

    def close(self) -> None:
        self.closed = True


class SerialEngine:
    def __init__(
        self,
        preset: ModelPreset,
        dit: torch.nn.Module,
        vae: WanVAE,
        context_encoder: ContextEncoder,
        device: torch.device,
        cpu_threads: int = DEFAULT_CPU_THREADS,
    ) -> None:
        if cpu_threads < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {cpu_threads}")
        self.preset = preset
        self.family: ModelFamily = family_for(preset)
        self.dit = dit
        self.vae = vae
        self.context_encoder = context_encoder
        self.device = device
        self.cpu_threads = cpu_threads

    @staticmethod
    def load(
        preset: str | ModelPreset,
        checkpoint_dir: str | Path | None = None,
        device: str | torch.device = "cpu",
        weights_seed: int = 0,
        cpu_threads: int = DEFAULT_CPU_THREADS,
        kernels: KernelConfig = DEFAULT_KERNELS,
        random_weights: bool = False,
        savings: Savings = NO_SAVINGS,
    ) -> SerialEngine:
        """Build the engine. Without a checkpoint, components get seeded random weights.

        `cpu_threads`: torch intra-op threads for model code (the determinism contract's thread count).
        `kernels`: attention backend, compile and deterministic mode (process-wide parts apply to
        this process). `random_weights`: seeded random weights even for a preset that runs on
        released ones (timing and memory without its checkpoint; the frames are noise).
        """
        preset = get_preset(preset) if isinstance(preset, str) else preset
        dev = torch.device(device)
        if random_weights and checkpoint_dir is not None:
            raise ValueError("random_weights and a checkpoint directory exclude each other")
        if not random_weights:
            require_checkpoint(preset, checkpoint_dir)
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
        apply_to_process(kernels, dev)
        family = family_for(preset)
        savings.check(dev)
        return SerialEngine(
            preset,
            family.load_dit_with(preset, dev, ckpt, weights_seed, kernels, savings),
            load_vae(preset, dev, ckpt, weights_seed, savings),
            family.load_context_encoder_with(preset, dev, ckpt, weights_seed, savings),
            dev,
            cpu_threads,
        )

    def _shared(self) -> dict[str, object]:
        """What every session of this engine points at and a snapshot keeps by reference."""
        return {"dit": self.dit, "vae": self.vae, "context_encoder": self.context_encoder}

    def snapshot(self, session: SerialSession) -> StatePart:
        """Everything that determines `session`'s next frames, copied to the host: its caches, its
        generator's state, its pose and its counters (workers/session_state.py)."""
        if session.closed:
            raise RuntimeError("session is closed")
        return capture(session, self._shared()).to_host()

    def branch(self, snapshot: StatePart) -> SerialSession:
        """A new session that continues from `snapshot`: fed the same controls as the session it was
        taken from, it produces the same frames, bit for bit (at this engine's thread count)."""
        session = restore(snapshot, self._shared(), self.device)
        if not isinstance(session, SerialSession) or session.preset != self.preset:
            raise ValueError(f"the snapshot is not of a {self.preset.name} session of this engine")
        return session

    def set_prompt(self, session: SerialSession, text: str, transition_chunks: int = 1) -> None:
        """The session's prompt from its next chunk on, reached over `transition_chunks` chunks
        (what the pipeline does when the DiT takes a prompt change with a chunk)."""
        if not self.family.live_prompts:
            raise ValueError(f"{self.preset.name} takes no text: its prompt cannot change")
        with intra_op_threads(self.cpu_threads):
            context = self.context_encoder.encode_prompt(text).to(self.device)
            session.denoise.change_prompt(context.to(session.denoise.device), text, transition_chunks)

    def create_session(
        self,
        image: str | Path | np.ndarray,
        prompt: str = "",
        seed: int = 0,
        chunk_latent_frames: int | None = None,
    ) -> SerialSession:
        p = self.preset
        chunk = chunk_latent_frames if chunk_latent_frames is not None else p.chunk_latent_frames
        if chunk < 1:
            raise ValueError(f"chunk_latent_frames must be >= 1, got {chunk}")
        if p.dit.local_attn_size_frames != -1 and chunk + p.dit.sink_size_frames >= p.dit.local_attn_size_frames:
            raise ValueError(
                f"chunk of {chunk} latent frames does not fit the attention window "
                f"({p.dit.local_attn_size_frames} frames, {p.dit.sink_size_frames} sink)"
            )
        rgb = to_model_range(fit_image(read_image(image), p.height_px, p.width_px))
        with intra_op_threads(self.cpu_threads):
            context = self.context_encoder.encode(rgb, prompt).to(self.device)  # from the host under a saving
            return SerialSession(
                preset=p,
                chunk_latent_frames=chunk,
                condition=ImageConditionStream(self.vae, rgb, p, chunk),
                control=self.family.control_track(p),
                denoise=self.family.open_denoise(self.dit, p, context, seed, chunk, prompt=prompt),
                decode=DecodeSession(self.vae),
                cpu_threads=self.cpu_threads,
            )
