"""Typed messages between the scheduler (server process) and stage workers, dispatched by type.

They travel over per-worker pipes. They hold only small values: ids, indices, controls, timings,
and `SlotRef`s naming tensors that live in a producer's slots (tensors never pass through the
server process). A client never supplies these objects: the server builds them from validated
input, so pickling them between our own processes is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from workers.controls import ChunkControl
from workers.runtime.channel import Ack, InlineTensor, SlotRef
from workers.runtime.peak_memory import PeakMemory

TensorRef = SlotRef | InlineTensor


class Stage(StrEnum):
    ENCODE = "encode"
    DIT = "dit"
    DECODE = "decode"


STAGES = (Stage.ENCODE, Stage.DIT, Stage.DECODE)  # pipeline order
UPSTREAM = {Stage.DIT: Stage.ENCODE, Stage.DECODE: Stage.DIT}  # whose output each stage reads


# ---- scheduler -> worker ----


@dataclass(frozen=True)
class OpenSession:
    session_id: str
    epoch: int
    chunk_latent_frames: int
    seed: int = 0
    image: np.ndarray | None = None  # encode: HxWx3 uint8, already fitted to the model resolution
    prompt: str = ""  # encode (to encode), dit (the text its receipts name)
    context: TensorRef | None = None  # dit: the session's context (prompt embeddings, CLIP tokens) from encode
    snapshot: str | None = None  # every stage: start from this snapshot's part (no image, prompt or context)
    # A snapshot saved to disk (KeepSnapshot): its parts are read from `<snapshot_dir>/<snapshot>/`.
    snapshot_dir: str | None = None


@dataclass(frozen=True)
class EncodeChunk:
    session_id: str
    epoch: int
    chunk_index: int


@dataclass(frozen=True)
class EncodePrompt:
    """Encode a prompt the driver typed while walking: the text encoder's forward on the encode
    stage, ahead of the chunk work there, off the DiT's path."""

    session_id: str
    epoch: int
    version: int  # the session's prompt changes, counted: the DiT is handed the latest one encoded
    text: str
    transition_chunks: int
    at_chunk: int | None = None  # a replay's change: for exactly this chunk (None: the DiT's next)


@dataclass(frozen=True)
class PromptChange:
    """A new context for the DiT from the chunk it comes with on; with `transition_chunks` > 1 the
    context moves from the old one to it over that many chunks."""

    version: int
    text: str
    transition_chunks: int
    context: TensorRef
    at_chunk: int | None = None


@dataclass(frozen=True)
class DenoiseChunk:
    session_id: str
    epoch: int
    chunk_index: int
    cond: TensorRef
    control: ChunkControl
    reset_pose: bool = False
    prompt: PromptChange | None = None


@dataclass(frozen=True)
class DecodeChunk:
    session_id: str
    epoch: int
    chunk_index: int
    latents: TensorRef


@dataclass(frozen=True)
class CloseSession:
    session_id: str


@dataclass(frozen=True)
class TakeSnapshot:
    """Copy the session's state, as it is between two chunks, into the stage's snapshot store."""

    session_id: str
    epoch: int
    snapshot_id: str


@dataclass(frozen=True)
class DropSnapshot:
    """Forget a snapshot's part, in memory or spilled (no reply; a part never taken is no error)."""

    snapshot_id: str


@dataclass(frozen=True)
class SpillSnapshot:
    """Move a snapshot's part from memory to files in `directory` (no reply)."""

    snapshot_id: str
    directory: str


@dataclass(frozen=True)
class KeepSnapshot:
    """Write a snapshot's part to files in `directory`/<snapshot_id>/ and free its memory: from now
    on the files are the part (replied with SnapshotKept once they are complete)."""

    snapshot_id: str
    directory: str


@dataclass(frozen=True)
class Release:
    """Acks forwarded from consumers to the producer that owns the slots."""

    acks: tuple[Ack, ...]


@dataclass(frozen=True)
class QueryStats:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


Command = (
    OpenSession
    | EncodePrompt
    | EncodeChunk
    | DenoiseChunk
    | DecodeChunk
    | CloseSession
    | TakeSnapshot
    | DropSnapshot
    | SpillSnapshot
    | KeepSnapshot
    | Release
    | QueryStats
    | Shutdown
)


# ---- worker -> scheduler ----


@dataclass(frozen=True)
class WorkerReady:
    stage: Stage
    rank: int
    pid: int
    device: str
    load_s: float


@dataclass(frozen=True)
class SessionOpened:
    stage: Stage
    rank: int
    session_id: str
    epoch: int
    context: TensorRef | None = None  # encode: the session's context for the DiT
    acks: tuple[Ack, ...] = ()


@dataclass(frozen=True)
class ChunkDone:
    """A stage finished a chunk. `output` is set by rank 0 of a stage that produces a tensor."""

    stage: Stage
    rank: int
    session_id: str
    epoch: int
    chunk_index: int
    busy_s: float  # compute time inside the worker (device-synchronised)
    output: TensorRef | None = None
    acks: tuple[Ack, ...] = ()  # inputs this rank has finished reading
    # DiT rank 0: the chunk's control input as the model consumed it (ModelFamily.describe_inputs).
    model_input: dict[str, Any] | None = None
    # DiT rank 0 of a family with text: the prompt the chunk's context came from (ChunkDenoiser.prompt_receipt).
    prompt: dict[str, Any] | None = None
    # DiT: the chunk's commit forward runs after this reply and ends the command (ChunkCommitted).
    commit_follows: bool = False


@dataclass(frozen=True)
class PromptEncoded:
    """Encode rank 0: a prompt's context, for the DiT's next chunk (the command's fields echoed)."""

    stage: Stage
    rank: int
    session_id: str
    epoch: int
    version: int
    text: str
    transition_chunks: int
    context: TensorRef
    busy_s: float
    at_chunk: int | None = None

    @staticmethod
    def answer(cmd: EncodePrompt, stage: Stage, rank: int, context: TensorRef, busy_s: float) -> PromptEncoded:
        return PromptEncoded(
            stage,
            rank,
            cmd.session_id,
            cmd.epoch,
            cmd.version,
            cmd.text,
            cmd.transition_chunks,
            context,
            busy_s,
            cmd.at_chunk,
        )


@dataclass(frozen=True)
class FramesReady:
    """Decode rank 0: frames of a chunk that are ready before the chunk is done (streamed ahead of
    its ChunkDone, in order). `offset`: frames of the chunk before these; `last`: the final part."""

    stage: Stage
    rank: int
    session_id: str
    epoch: int
    chunk_index: int
    offset: int
    last: bool
    output: TensorRef


@dataclass(frozen=True)
class ChunkCommitted:
    """DiT: a chunk's commit forward, run after its ChunkDone (workers/stages/denoise.py), is done
    (`busy_s` of compute) or failed (`error`: the session's caches are lost, so is the session). It
    ends the command: the chunk's latents went on with the ChunkDone, the stage takes no other
    command (and samples no other chunk's controls) before this."""

    stage: Stage
    rank: int
    session_id: str
    epoch: int
    chunk_index: int
    busy_s: float
    error: str | None = None


@dataclass(frozen=True)
class SessionClosed:
    stage: Stage
    rank: int
    session_id: str


@dataclass(frozen=True)
class SnapshotTaken:
    """A rank's part of a snapshot is stored (`nbytes` of it), or it could not be (`error`; the
    session itself goes on)."""

    stage: Stage
    rank: int
    session_id: str
    epoch: int
    snapshot_id: str
    nbytes: int
    error: str | None = None


@dataclass(frozen=True)
class SnapshotKept:
    """A rank's part of a snapshot is written to its files (or could not be: `error`)."""

    stage: Stage
    rank: int
    snapshot_id: str
    error: str | None = None


@dataclass(frozen=True)
class StageStats:
    stage: Stage
    rank: int
    channel: dict[str, int]
    slots_in_use: int
    sessions: int
    peak_memory: PeakMemory


# Between a stage's name and the exception it raised, in StageFailed.error: a viewer is told which
# stage failed, the operator's log gets the rest (server/session/session.py).
RAISED = " raised "


def raised(stage: Stage, rank: int, exc: BaseException) -> str:
    """StageFailed.error (or ChunkCommitted.error) for an exception a stage's command raised."""
    return f"{stage.value} stage (rank {rank}){RAISED}{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class StageFailed:
    """A command failed. `fatal`: the worker is exiting (its whole stage must be restarted)."""

    stage: Stage
    rank: int
    session_id: str | None
    error: str
    fatal: bool


Reply = (
    WorkerReady
    | SessionOpened
    | PromptEncoded
    | FramesReady
    | ChunkDone
    | ChunkCommitted
    | SessionClosed
    | SnapshotTaken
    | SnapshotKept
    | StageStats
    | StageFailed
)
