"""The dispatch rules: what a stage does next for one session (`next_work`), within the bounds the
scheduler was built with (`ChunkRules`). The scheduler (workers/runtime/scheduler.py) offers each
idle stage, downstream first and round robin over sessions, the first work these rules give.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from workers.runtime.messages import DecodeChunk, DenoiseChunk, EncodeChunk, Stage, TakeSnapshot
from workers.runtime.scheduled_session import Hold, Session


class Schedule(Enum):
    PIPELINED = "pipelined"
    SERIAL = "serial"  # the A/B baseline: one chunk through all stages at a time


@dataclass(frozen=True)
class ChunkRules:
    schedule: Schedule
    prefetch_chunks: int  # conditions encoded ahead of the DiT, per session
    edge_capacity: int  # latents waiting for (or in) decode, per session


Work = EncodeChunk | DenoiseChunk | DecodeChunk | TakeSnapshot


def next_work(rules: ChunkRules, stage: Stage, s: Session, now: float) -> Work | Hold | None:
    """What `stage` does next for session `s`, if anything: the snapshot at its boundary first; then
    the encode of the next chunk (at most `prefetch_chunks` ahead of the DiT), the DiT's next chunk
    (its control sampled now, when it could start; at most `edge_capacity` latents waiting for
    decode), or the decode of the oldest latents. A `Hold` from the control source is handed on: ask
    again then. Taking work moves the session's counters and stamps its chunk record."""
    snap = s.snapshot
    if snap is not None and stage not in snap.sent and s.position(stage) == snap.boundary:
        snap.sent.add(stage)
        return TakeSnapshot(s.id, s.spec.epoch, snap.snapshot_id)
    serial = rules.schedule is Schedule.SERIAL
    if stage is Stage.ENCODE:
        k = s.next_encode
        ahead = len(s.encoded) + (Stage.ENCODE in s.computing)
        if not s.wants_more(k) or ahead >= rules.prefetch_chunks or (serial and k > s.chunks_out):
            return None
        s.next_encode += 1
        s.record(k).stages[Stage.ENCODE].ready_t = now
        return EncodeChunk(s.id, s.spec.epoch, k)
    if stage is Stage.DIT:
        if not s.encoded or s.encoded[0][0] != s.next_dit:
            return None
        waiting = len(s.denoised) + (Stage.DECODE in s.computing)
        if waiting >= rules.edge_capacity or (serial and s.next_dit > s.chunks_out):
            return None
        if s.next_dit in s.prompts_at and s.prompts_at[s.next_dit] is None:
            return None  # a replay's prompt change for this chunk is still being encoded
        sampled = s.spec.control_source(s.next_dit)  # controls are sampled now, when the DiT could start
        if sampled is None:
            return None
        if isinstance(sampled, Hold):
            return sampled
        control, reset = sampled
        k, cond = s.encoded.popleft()
        s.next_dit += 1
        s.record(k).control = control
        prompt = s.prompts_at.pop(k, None)
        if prompt is None:
            prompt, s.prompt_ready = s.prompt_ready, None
        if prompt is not None:
            s.record(k).prompt_change = {"text": prompt.text, "transition_chunks": prompt.transition_chunks}
        return DenoiseChunk(s.id, s.spec.epoch, k, cond, control, reset, prompt)
    if not s.denoised:
        return None
    k, latents = s.denoised.popleft()
    return DecodeChunk(s.id, s.spec.epoch, k, latents)
