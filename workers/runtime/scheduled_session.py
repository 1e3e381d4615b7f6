"""A session as the scheduler keeps it: what it was opened with (`SessionSpec`), its state, where
each stage is in its chunks, the conditions and latents waiting between stages, its slot ledger and
its chunk records, and a snapshot being taken (workers/runtime/scheduler.py decides; this holds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from workers.controls import ChunkControl
from workers.runtime.ledger import SlotLedger
from workers.runtime.messages import FramesReady, PromptChange, Stage, TensorRef
from workers.runtime.records import ChunkOutput, ChunkRecord


class SessionState(Enum):
    OPENING = "opening"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


LIVE = (SessionState.OPENING, SessionState.RUNNING)  # a session that still takes work (a prompt, a close)


@dataclass(frozen=True)
class Hold:
    """A control source's "not yet": ask again in `retry_in_s` (the engine wakes for it)."""

    retry_in_s: float


# chunk index -> (control, reset pose) to start the chunk now; Hold to start it later; None to hold
# it back until something changes (asked again on the next pass). The consumer's flow control.
ControlSource = Callable[[int], tuple[ChunkControl, bool] | Hold | None]


@dataclass(frozen=True)
class SessionSpec:
    id: str
    epoch: int
    seed: int
    chunk_latent_frames: int
    image: np.ndarray  # HxWx3 uint8, fitted to the model
    prompt: str
    control_source: ControlSource
    on_chunk: Callable[[ChunkOutput], None]
    on_end: Callable[[str, str | None], None]  # (session id, error or None)
    max_chunks: int | None = None  # chunks this session generates (from first_chunk)
    snapshot: str | None = None  # open from this snapshot's parts instead of the image and prompt
    snapshot_dir: str | None = None  # a saved snapshot: where its parts' files are
    first_chunk: int = 0  # a snapshot's boundary: the index of the session's first chunk


@dataclass
class PendingSnapshot:
    snapshot_id: str
    boundary: int  # taken after chunk boundary − 1, before chunk boundary
    sent: set[Stage] = field(default_factory=set)
    nbytes: dict[Stage, int] = field(default_factory=dict)


@dataclass
class Session:
    spec: SessionSpec
    state: SessionState = SessionState.OPENING
    opened: set[Stage] = field(default_factory=set)
    closed: set[Stage] = field(default_factory=set)
    next_encode: int = 0
    next_dit: int = 0
    chunks_out: int = 0
    encoded: deque[tuple[int, TensorRef]] = field(default_factory=deque)  # conditions waiting for the DiT
    denoised: deque[tuple[int, TensorRef]] = field(default_factory=deque)  # latents waiting for decode
    computing: dict[Stage, int] = field(default_factory=dict)  # stage -> the chunk it computes for us
    records: dict[int, ChunkRecord] = field(default_factory=dict)
    ledger: SlotLedger = field(default_factory=SlotLedger)
    last_part: FramesReady | None = None  # a chunk's final frames, held until its decode is done
    snapshot: PendingSnapshot | None = None  # being taken
    prompt_versions: int = 0  # prompt changes asked for
    prompt_ready: PromptChange | None = None  # encoded, for the DiT's next chunk
    prompts_at: dict[int, PromptChange | None] = field(default_factory=dict)  # a replay's, by chunk (None: encoding)
    error: str | None = None

    def __post_init__(self) -> None:
        self.next_encode = self.next_dit = self.chunks_out = self.spec.first_chunk

    @property
    def id(self) -> str:
        return self.spec.id

    def record(self, index: int) -> ChunkRecord:
        if index not in self.records:
            self.records[index] = ChunkRecord(index)
        return self.records[index]

    def wants_more(self, index: int) -> bool:
        limit = self.spec.max_chunks
        return self.state is SessionState.RUNNING and (limit is None or index - self.spec.first_chunk < limit)

    def position(self, stage: Stage) -> int | None:
        """Chunks `stage` has finished for this session, None while it computes one."""
        if stage in self.computing:
            return None
        return {Stage.ENCODE: self.next_encode, Stage.DIT: self.next_dit, Stage.DECODE: self.chunks_out}[stage]
