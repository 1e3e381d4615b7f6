"""What the engine hands back per chunk: its timings per stage, and its frames in parts.

Times are the scheduler's clock (perf_counter seconds). A chunk's frames arrive in parts, in order,
as the decode stage hands them on; consumers that want whole chunks gather them with ChunkAssembler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.controls import ChunkControl
from workers.runtime.messages import STAGES, Stage


@dataclass
class StageTiming:
    ready_t: float | None = None  # input available for this stage
    dispatch_t: float | None = None
    done_t: float | None = None
    # Compute time inside the worker (rank 0's) until the stage answered: the DiT's commit forward
    # comes after its answer and counts only in the stage's busy time (ChunkCommitted).
    busy_s: float = 0.0
    rank_busy_s: tuple[float, ...] = ()  # every rank's compute time, by rank

    @property
    def queue_wait_s(self) -> float | None:
        if self.ready_t is None or self.dispatch_t is None:
            return None
        return self.dispatch_t - self.ready_t


@dataclass
class ChunkRecord:
    index: int
    stages: dict[Stage, StageTiming] = field(default_factory=lambda: {s: StageTiming() for s in STAGES})
    control: ChunkControl | None = None  # sampled when the DiT started the chunk
    model_input: dict[str, Any] | None = None  # that control as the DiT consumed it (ModelFamily.describe_inputs)
    prompt: dict[str, Any] | None = None  # the prompt the DiT's context came from (ChunkDenoiser.prompt_receipt)
    # A prompt change the DiT took with this chunk, as typed: {"text", "transition_chunks"} (recordings keep it).
    prompt_change: dict[str, Any] | None = None
    num_frames: int = 0  # handed on so far
    frames_ready_t: float | None = None  # the chunk's first frames handed on

    def stage_spans_s(self, origin_t: float) -> dict[str, list[float]]:
        """Each finished stage's compute for this chunk, [start, end] in seconds from `origin_t`: its
        busy time, ending when its reply came (what the stage timeline draws)."""
        return {
            s.value: [tm.done_t - tm.busy_s - origin_t, tm.done_t - origin_t]
            for s, tm in self.stages.items()
            if tm.done_t is not None
        }

    def rank_spans_s(self, origin_t: float) -> dict[str, list[list[float]]]:
        """Per rank, for stages that run on more than one: each rank's busy time, ending when the
        stage's last reply came (ranks of one stage finish together, at their last collective)."""
        return {
            s.value: [[tm.done_t - busy - origin_t, tm.done_t - origin_t] for busy in tm.rank_busy_s]
            for s, tm in self.stages.items()
            if tm.done_t is not None and len(tm.rank_busy_s) > 1
        }


@dataclass(frozen=True)
class ChunkOutput:
    """Part of a chunk's frames (`offset`: the chunk's frames before these). The `last` part comes
    when the chunk is done, with its `record` complete."""

    session_id: str
    index: int
    frames: np.ndarray  # [T, H, W, 3] uint8, owned by the receiver
    record: ChunkRecord
    offset: int = 0
    last: bool = True


class ChunkAssembler:
    """For consumers that want whole chunks: gathers a chunk's parts, returns the chunk at its last."""

    def __init__(self) -> None:
        self._parts: dict[int, list[np.ndarray]] = {}

    def add(self, out: ChunkOutput) -> ChunkOutput | None:
        parts = self._parts.setdefault(out.index, [])
        assert out.offset == sum(len(p) for p in parts), f"chunk {out.index}: part at {out.offset} out of order"
        parts.append(out.frames)
        if not out.last:
            return None
        frames = np.concatenate(self._parts.pop(out.index))
        return ChunkOutput(out.session_id, out.index, frames, out.record)
