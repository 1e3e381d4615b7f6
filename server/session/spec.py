"""What a session generates from, fixed when it is created: the start image, prompt and seed, the
frame rate and chunk size, and how long it may run. A branch takes its line's (the snapshot's
origin); the client may ask for less time than the server allows, never more. The `ready` message
and the recording's recipe state it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from server.common.settings import Settings
from server.media.recording import Recipe
from server.snapshots.snapshot import Origin, ServerSnapshot
from server.wire.dispatch import DispatchPolicy
from server.wire.protocol import Parent, ReadyMsg
from workers.chunk_geometry import chunk_num_frames
from workers.controls import client_contract
from workers.models.presets import ModelPreset
from workers.models.savings import Savings
from workers.runtime.placement import Placement


@dataclass(frozen=True)
class SessionSpec:
    image: np.ndarray  # HxWx3 uint8, fitted to the model
    prompt: str
    seed: int
    scene: str | None
    fps: int
    chunk_latent_frames: int
    max_duration_s: float | None

    @classmethod
    def resolve(
        cls,
        preset: ModelPreset,
        settings: Settings,
        image: np.ndarray,
        prompt: str,
        seed: int,
        max_duration_s: float | None,
        fps: int | None,
        chunk_latent_frames: int | None,
        scene: str | None,
        branch_of: ServerSnapshot | None,
    ) -> SessionSpec:
        if branch_of is not None:
            o = branch_of.origin
            image, prompt, seed, scene = o.image, o.prompt, o.seed, o.scene
            fps, chunk_latent_frames = o.fps, o.chunk_latent_frames
        limits = [t for t in (max_duration_s, settings.session_limit_s) if t]
        return cls(
            image=image,
            prompt=prompt,
            seed=seed,
            scene=scene,
            fps=fps or settings.fps or preset.fps,
            chunk_latent_frames=chunk_latent_frames or preset.chunk_latent_frames,
            max_duration_s=min(limits) if limits else None,
        )

    @property
    def chunk_frames(self) -> int:
        return chunk_num_frames(1, self.chunk_latent_frames)

    def origin(self, line: str) -> Origin:
        """What a branch from this session's line starts from (`line`: the line's first session)."""
        return Origin(self.image, self.prompt, self.seed, self.fps, self.chunk_latent_frames, self.scene, line=line)

    def ready_message(
        self,
        session_id: str,
        preset: ModelPreset,
        settings: Settings,
        dispatch: DispatchPolicy,
        role: Literal["driver", "spectator"],
        parent: Parent | None,
    ) -> ReadyMsg:
        """The data channel's first message: the video's size and rate, the controls, the limits."""
        return ReadyMsg(
            session_id=session_id,
            model=preset.name,
            weights=preset.weights_note,
            width=preset.width_px,
            height=preset.height_px,
            fps=self.fps,
            chunk_frames=self.chunk_frames,
            dispatch=dispatch.value,
            controls=client_contract(),
            idle_timeout_s=settings.idle_timeout_s,
            max_duration_s=self.max_duration_s,
            role=role,
            parent=parent,
        )

    def recipe(self, preset: ModelPreset, placement: Placement, weights_digest: str, savings: Savings) -> Recipe:
        """What determines the session's frames besides its controls, as its recording states it."""
        return Recipe(
            model=preset.name,
            weights=weights_digest,
            placement=placement.name,
            placement_stages=placement.stage_record(),
            intra_op_threads=placement.cpu_threads_per_worker,
            seed=self.seed,
            prompt=self.prompt,
            fps=self.fps,
            chunk_latent_frames=self.chunk_latent_frames,
            image=self.image,
            savings=savings.record(),
        )
