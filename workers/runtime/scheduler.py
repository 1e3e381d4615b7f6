"""The scheduler: every decision the pipeline engine makes, and none of its plumbing.

It keeps the session table (enum states, epochs), one lane per stage (the command the stage is
computing, its queued open/close commands, a round-robin pointer, busy and idle time) and each
session's slot ledger. Its inputs are requests (open, close), worker replies and stage deaths, each
with a clock reading; its outputs are effects, which the engine carries out in order:

    Send(stage, command)          to every rank of the stage
    ReleaseSlots(producer, acks)  hand consumed or discarded slots back to their producer
    Deliver(session, part, ...)   copy part of a chunk's frames out of the frame ring and hand them
                                  to the session (a ReleaseSlots for that slot always follows)
    Ended(session, error)         the session is over
    SnapshotDone(...)             a snapshot's parts are all stored, or it failed (its parts to drop)
    StageLost(stage, error)       the stage's workers are dead, failed fatally or hung: kill what is
                                  left of them and start new ones (`stage_up` once they are ready)

No pipes, threads or processes: tests drive it with synthetic replies in milliseconds. Its parts,
each tested alone: a session as it keeps it (`scheduled_session.py`), a stage's lane, deadlines and
busy/idle time (`lanes.py`), the dispatch rules of what a stage does next for a session
(`chunk_rules.py`), and the effects (`effects.py`).

Policy:
- Downstream first: each pass offers decode, then DiT, then encode, so finished work drains before
  new work fills the pipe. Sessions share a stage round robin, at chunk boundaries.
- Bounds per session: at most `prefetch_chunks` conditions encoded ahead of the DiT and at most
  `edge_capacity` latents waiting for (or in) decode. `Schedule.SERIAL`, the A/B baseline, starts
  chunk k+1 only once chunk k's frames are out.
- A chunk's control is sampled when the DiT could start it, from the session's control source,
  which may also hold the chunk back (None: until the next pass; Hold: until a time).
- A DiT chunk answers twice: its latents (`ChunkDone`, `commit_follows`), which go on to the decode
  at once, then its commit forward (`ChunkCommitted`), which ends the command: until then the DiT
  is busy, so no other chunk's control is sampled early.
- Epochs: every command carries its session's epoch; a reply for a session closed (or failed) since
  is a late result: dropped, counted, and its slots handed back.
- Snapshots: a session's state is saved at one chunk boundary b on every stage: b is the next
  chunk the encode stage (the furthest ahead) would start, and each stage copies its state when it
  has finished chunk b − 1 and before it starts chunk b, in its own lane's order; no stage waits
  for another. A session opened from a snapshot starts at chunk b on every stage.
- Prompts typed while walking: each is encoded on the encode stage as soon as it comes (queued
  ahead of chunk work there; a newer one replaces a queued older one, so at most one waits and one
  is encoded per session: latest wins), and the DiT's next chunk to start after it is encoded
  takes its context (a chunk the DiT has started keeps the context it started with). An encoded
  prompt overtaken by a newer one before the DiT took it is handed back unread. A replay's prompt
  changes name their chunk (`at_chunk`): each is kept, and the DiT waits for it before that chunk.
- Close: once nothing is in flight, per-stage state is released one stage at a time, downstream
  first; whatever the session's ledger still holds then has leaked (counted).
- Deadlines: a stage that has not answered a command by its deadline is hung (a stopped process, a
  deadlocked collective): it is lost like a dead one. The deadline scales with the stage's own recent
  answers to that kind of command (`Deadlines`), so a slow model is not mistaken for a hung one.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from workers.runtime.channel import Ack, InlineTensor, Outcome
from workers.runtime.chunk_rules import ChunkRules, Schedule, next_work
from workers.runtime.effects import Deliver, Effect, Ended, ReleaseSlots, Send, SnapshotDone, StageLost
from workers.runtime.lanes import Assignment, CommandKind, Deadlines, Lane
from workers.runtime.ledger import acks_to_forward, slot_key
from workers.runtime.messages import (
    STAGES,
    UPSTREAM,
    ChunkCommitted,
    ChunkDone,
    CloseSession,
    Command,
    DecodeChunk,
    DenoiseChunk,
    EncodePrompt,
    FramesReady,
    OpenSession,
    PromptChange,
    PromptEncoded,
    Reply,
    SessionOpened,
    SnapshotTaken,
    Stage,
    StageFailed,
    TakeSnapshot,
    TensorRef,
)
from workers.runtime.scheduled_session import LIVE, Hold, PendingSnapshot, Session, SessionSpec, SessionState

_KIND_OF_QUEUED = {OpenSession: CommandKind.OPEN, EncodePrompt: CommandKind.PROMPT, CloseSession: CommandKind.CLOSE}


def _inputs_of(cmd: Command) -> tuple[tuple[Stage, TensorRef], ...]:
    if isinstance(cmd, DenoiseChunk):
        prompt = () if cmd.prompt is None else ((Stage.ENCODE, cmd.prompt.context),)
        return ((Stage.ENCODE, cmd.cond), *prompt)
    if isinstance(cmd, DecodeChunk):
        return ((Stage.DIT, cmd.latents),)
    if isinstance(cmd, OpenSession) and cmd.context is not None:
        return ((Stage.ENCODE, cmd.context),)
    return ()


def _frames_in(ref: TensorRef) -> int:
    return int(ref.tensor.shape[0]) if isinstance(ref, InlineTensor) else ref.shape[0]


class Scheduler:
    def __init__(
        self,
        world_sizes: dict[Stage, int],
        schedule: Schedule = Schedule.PIPELINED,
        prefetch_chunks: int = 2,
        edge_capacity: int = 2,
        origin_t: float = 0.0,
        deadlines: Deadlines | None = None,
    ) -> None:
        if prefetch_chunks < 1 or edge_capacity < 1:
            raise ValueError("prefetch_chunks and edge_capacity must be at least 1")
        self.rules = ChunkRules(schedule, 1 if schedule is Schedule.SERIAL else prefetch_chunks, edge_capacity)
        self.deadlines = deadlines or Deadlines()
        self.origin_t = origin_t  # idle intervals count from here
        self.lanes = {s: Lane(s, world_sizes[s]) for s in STAGES}
        self.sessions: dict[str, Session] = {}
        self.counters = {"late_results_dropped": 0, "leaked_slots": 0, "sessions_failed": 0, "stages_hung": 0}
        self.retry_at = math.inf  # the earliest Hold or command deadline of the last pass
        self._epochs = itertools.count(1)
        self._out: list[Effect] = []

    # ---- requests ----

    def next_epoch(self) -> int:
        return next(self._epochs)

    def active_sessions(self) -> int:
        return sum(s.state in LIVE for s in self.sessions.values())

    def open(self, spec: SessionSpec) -> list[Effect]:
        """Start a session: the encode and decode stages open it first (the DiT needs the prompt's embeddings)."""
        self.sessions[spec.id] = Session(spec)
        c, snap = spec.chunk_latent_frames, spec.snapshot
        if snap is None:
            self.lanes[Stage.ENCODE].queued.append(
                OpenSession(spec.id, spec.epoch, c, spec.seed, spec.image, spec.prompt)
            )
        else:
            self.lanes[Stage.ENCODE].queued.append(
                OpenSession(spec.id, spec.epoch, c, spec.seed, snapshot=snap, snapshot_dir=spec.snapshot_dir)
            )
        self.lanes[Stage.DECODE].queued.append(
            OpenSession(spec.id, spec.epoch, c, spec.seed, snapshot=snap, snapshot_dir=spec.snapshot_dir)
        )
        return self._flush()

    def snapshot(self, session_id: str, snapshot_id: str) -> list[Effect]:
        """Save a session's state at its next chunk boundary (SnapshotDone says when, or why not)."""
        session = self.sessions.get(session_id)
        # An opening session is saved at its first chunk boundary, once it runs.
        if session is None or session.state not in LIVE:
            state = "over" if session is None else session.state.value
            error = f"the session is {state}: only a running session can be saved"
            self._out.append(SnapshotDone(snapshot_id, None if session is None else session.spec, 0, {}, error))
        elif session.snapshot is not None:
            self._out.append(
                SnapshotDone(snapshot_id, session.spec, 0, {}, "a snapshot of this session is being taken")
            )
        else:
            session.snapshot = PendingSnapshot(snapshot_id, session.next_encode)
        return self._flush()

    def set_prompt(
        self, session_id: str, text: str, transition_chunks: int = 1, at_chunk: int | None = None
    ) -> list[Effect]:
        """A new prompt for a session, from its DiT's next chunk once encoded, or (a replay's) from
        chunk `at_chunk` exactly, which the DiT then waits for (see Policy)."""
        session = self.sessions.get(session_id)
        if session is None or session.state not in LIVE:
            return self._flush()
        if at_chunk is not None and (at_chunk < session.next_dit or at_chunk in session.prompts_at):
            raise ValueError(f"a prompt change for chunk {at_chunk} comes too late or twice")
        session.prompt_versions += 1
        lane = self.lanes[Stage.ENCODE]
        if at_chunk is None:
            older = [
                c
                for c in lane.queued
                if isinstance(c, EncodePrompt) and c.session_id == session_id and c.at_chunk is None
            ]
            for cmd in older:
                lane.queued.remove(cmd)
        else:
            session.prompts_at[at_chunk] = None
        spec = session.spec
        version = session.prompt_versions
        lane.queued.append(EncodePrompt(spec.id, spec.epoch, version, text, transition_chunks, at_chunk))
        return self._flush()

    def close(self, session_id: str, error: str | None = None) -> list[Effect]:
        session = self.sessions.get(session_id)
        if session is not None and session.state in LIVE:
            session.state = SessionState.CLOSING
            session.error = error
            self._discard_queued(session)
            self._maybe_finish_close(session)
        return self._flush()

    def fail_all(self, error: str) -> list[Effect]:
        """Something went wrong in the engine itself: end every session now and forget all work."""
        for session in list(self.sessions.values()):
            self._finish(session, SessionState.FAILED, error)
        for lane in self.lanes.values():
            lane.assignment = None
            lane.queued.clear()
        return self._flush()

    def end_all(self) -> list[Effect]:
        """The engine is shutting down: every session ends (without error)."""
        for session in list(self.sessions.values()):
            self._finish(session, SessionState.CLOSED, None)
        return self._flush()

    # ---- worker events ----

    def stage_up(self, stage: Stage, now: float) -> None:
        lane = self.lanes[stage]
        lane.alive, lane.idle_since = True, now
        lane.answer_s.clear()  # new workers: their first calls get `Deadlines.first_s` again

    def stage_down(self, stage: Stage, error: str) -> list[Effect]:
        """A stage's workers died, failed fatally or hung: every session loses its state there; fail
        them all. The engine replaces the workers (StageLost)."""
        self._lose(stage, error)
        return self._flush()

    def on_reply(self, stage: Stage, rank: int, msg: Reply, now: float) -> list[Effect]:
        if isinstance(msg, StageFailed) and msg.fatal:
            self._lose(stage, msg.error)
            return self._flush()
        if isinstance(msg, FramesReady):
            self._on_frames(msg, now)  # ahead of the command's reply, which ends it
            return self._flush()
        lane = self.lanes[stage]
        assignment = lane.assignment
        assert assignment is not None, f"unexpected reply from {stage.value}: {msg!r}"
        if isinstance(msg, ChunkCommitted):
            assignment.commits.append(msg)
            if len(assignment.commits) == lane.world_size:
                self._on_committed(stage, lane.answered(self.deadlines, now))
            return self._flush()
        assignment.replies.append(msg)
        if len(assignment.replies) < lane.world_size:
            return self._flush()
        if isinstance(msg, ChunkDone) and msg.commit_follows:
            # The chunk's latents go on now; the stage stays busy (and its lane taken) until it commits.
            self._on_assignment_done(stage, assignment, now)
            assignment.inputs = ()  # handed back with the reply: nothing left for a loss to release
            return self._flush()
        self._on_assignment_done(stage, lane.answered(self.deadlines, now), now)
        return self._flush()

    # ---- dispatch ----

    def dispatch(self, now: float) -> list[Effect]:
        """Lose the stages that missed a deadline, then offer every idle stage its next command
        (downstream first)."""
        self.retry_at = math.inf
        for lane in self.lanes.values():
            a = lane.assignment
            if a is not None and now >= a.deadline_t:
                self.counters["stages_hung"] += 1
                what = a.kind.value if a.chunk_index is None else f"chunk {a.chunk_index}"
                waited_s = now - a.sent_t
                self._lose(lane.stage, f"{lane.stage.value} stage hung: no answer to {what} in {waited_s:.1f} s")
        for stage in reversed(STAGES):
            lane = self.lanes[stage]
            if not lane.alive or lane.assignment is not None:
                continue
            if lane.queued:
                cmd = lane.queued.popleft()
                session = self.sessions.get(cmd.session_id)
                if isinstance(cmd, EncodePrompt) and (session is None or session.state not in LIVE):
                    continue  # the session is closing: its prompt is moot
                if session is not None:
                    self._assign(lane, cmd, _KIND_OF_QUEUED[type(cmd)], session, None, now)
                continue
            order = list(self.sessions.values())
            for i in range(len(order)):
                session = order[(lane.rr + i) % len(order)]
                if session.state is not SessionState.RUNNING:
                    continue
                work = next_work(self.rules, stage, session, now)
                if isinstance(work, Hold):
                    self.retry_at = min(self.retry_at, now + work.retry_in_s)
                    continue
                if isinstance(work, TakeSnapshot):
                    self._assign(lane, work, CommandKind.SNAPSHOT, session, session.position(stage), now)
                    break
                if work is not None:
                    lane.rr = (lane.rr + i + 1) % len(order)
                    self._assign(lane, work, CommandKind.CHUNK, session, work.chunk_index, now)
                    break
        for lane in self.lanes.values():
            if lane.assignment is not None:
                self.retry_at = min(self.retry_at, lane.assignment.deadline_t)
        return self._flush()

    def report(self, now: float) -> dict[str, Any]:
        """Busy and idle seconds per stage; idle time counts while sessions are open, up to `now`."""
        return {stage.value: lane.times(now, bool(self.sessions)) for stage, lane in self.lanes.items()}

    def outstanding_slots(self) -> int:
        return sum(len(s.ledger) for s in self.sessions.values())

    # ---- internals: work ----

    def _assign(
        self, lane: Lane, cmd: Command, kind: CommandKind, session: Session, chunk: int | None, now: float
    ) -> None:
        assignment = Assignment(session.id, session.spec.epoch, kind, chunk, now, inputs=_inputs_of(cmd))
        lane.start(assignment, self.deadlines, now, self.origin_t, bool(self.sessions))
        if chunk is not None:  # a chunk, or a snapshot at a boundary: the session's work on this stage
            session.computing[lane.stage] = chunk
        if kind is CommandKind.CHUNK:
            assert chunk is not None
            session.record(chunk).stages[lane.stage].dispatch_t = now
        self._out.append(Send(lane.stage, cmd))

    # ---- internals: replies ----

    def _on_assignment_done(self, stage: Stage, assignment: Assignment, now: float) -> None:
        replies = assignment.replies
        session = self.sessions.get(assignment.session_id)
        current = session is not None and session.spec.epoch == assignment.epoch
        # Inputs every rank has read can go back to their producer now.
        acks = [a for r in replies if isinstance(r, ChunkDone | SessionOpened) for a in r.acks]
        if acks and stage in UPSTREAM:
            if current:
                assert session is not None
                for ack in acks:
                    session.ledger.untrack(ack.ref)
            self._release_acks(UPSTREAM[stage], acks_to_forward(acks))
        first = next(r for r in replies if r.rank == 0)  # rank 0 carries the stage's output
        if assignment.kind is CommandKind.CLOSE:
            if session is not None:
                session.closed.add(stage)
                self._maybe_finish_close(session)
            return
        if session is None or not current:
            self.counters["late_results_dropped"] += 1
            out = first.output if isinstance(first, ChunkDone) else None
            if isinstance(first, SessionOpened | PromptEncoded):
                out = first.context
            if out is not None:
                self._release_acks(stage, [Ack.of(out, "discarded")])
            self._release_unread(None, assignment, acks)
            return
        if assignment.kind in (CommandKind.CHUNK, CommandKind.SNAPSHOT):
            session.computing.pop(stage, None)
        if assignment.kind is CommandKind.SNAPSHOT:
            self._on_snapshot_part(session, stage, replies)
            if session.state is SessionState.CLOSING:
                self._maybe_finish_close(session)
            return
        failures = [r for r in replies if isinstance(r, StageFailed)]
        if failures:
            self._release_unread(session, assignment, acks)
            self._fail(session, failures[0].error)
            return
        if isinstance(first, SessionOpened):
            self._on_opened(session, stage, first)
        elif isinstance(first, PromptEncoded):
            self._on_prompt_encoded(session, first)
        else:
            assert isinstance(first, ChunkDone), first
            ranks = sorted((r for r in replies if isinstance(r, ChunkDone)), key=lambda r: r.rank)
            session.record(first.chunk_index).stages[stage].rank_busy_s = tuple(r.busy_s for r in ranks)
            self._on_chunk_done(session, stage, first, now)
        if session.state is SessionState.CLOSING:
            self._discard_queued(session)
            self._maybe_finish_close(session)

    def _on_opened(self, session: Session, stage: Stage, reply: SessionOpened) -> None:
        session.opened.add(stage)
        if stage is Stage.ENCODE:
            spec = session.spec
            if spec.snapshot is None:
                assert reply.context is not None
                session.ledger.track(reply.context)
            self.lanes[Stage.DIT].queued.append(
                OpenSession(
                    spec.id,
                    spec.epoch,
                    spec.chunk_latent_frames,
                    spec.seed,
                    prompt=spec.prompt,
                    context=reply.context,
                    snapshot=spec.snapshot,
                    snapshot_dir=spec.snapshot_dir,
                )
            )
        if session.opened == set(STAGES) and session.state is SessionState.OPENING:
            session.state = SessionState.RUNNING

    def _on_prompt_encoded(self, session: Session, reply: PromptEncoded) -> None:
        self.lanes[Stage.ENCODE].busy_s += reply.busy_s
        if session.state not in LIVE:
            self._release_acks(Stage.ENCODE, [Ack.of(reply.context, "discarded")])
            return
        session.ledger.track(reply.context)
        change = PromptChange(reply.version, reply.text, reply.transition_chunks, reply.context, reply.at_chunk)
        if reply.at_chunk is not None:
            session.prompts_at[reply.at_chunk] = change
            return
        overtaken = session.prompt_ready
        if overtaken is not None:  # encoded, and replaced before the DiT took it
            self._release(session, Stage.ENCODE, [overtaken.context], "discarded")
        session.prompt_ready = change

    def _on_chunk_done(self, session: Session, stage: Stage, reply: ChunkDone, now: float) -> None:
        rec = session.record(reply.chunk_index)
        tm = rec.stages[stage]
        tm.done_t, tm.busy_s = now, reply.busy_s
        if reply.model_input is not None:
            rec.model_input = reply.model_input
        if reply.prompt is not None:
            rec.prompt = reply.prompt
        self.lanes[stage].busy_s += reply.busy_s
        if stage is Stage.DECODE:  # its frames came ahead, as FramesReady parts
            last, session.last_part = session.last_part, None
            session.chunks_out += 1
            if last is not None:  # None: the session stopped running while the chunk decoded
                assert last.chunk_index == reply.chunk_index, "a chunk's last frames came with another chunk"
                self._deliver(session, last, now, done=True)
            session.records.pop(reply.chunk_index, None)  # complete and handed on: a long session keeps none
            limit = session.spec.max_chunks
            done = session.chunks_out - session.spec.first_chunk
            if limit is not None and done >= limit and session.state is SessionState.RUNNING:
                session.state = SessionState.CLOSING
                self._discard_queued(session)
                self._maybe_finish_close(session)
            return
        assert reply.output is not None, f"{stage.value} rank 0 published no output"
        session.ledger.track(reply.output)
        if stage is Stage.ENCODE:
            session.encoded.append((reply.chunk_index, reply.output))
            rec.stages[Stage.DIT].ready_t = now
        else:
            session.denoised.append((reply.chunk_index, reply.output))
            rec.stages[Stage.DECODE].ready_t = now

    def _on_snapshot_part(self, session: Session, stage: Stage, replies: list[Reply]) -> None:
        snap = session.snapshot
        assert snap is not None, "a snapshot reply without a snapshot being taken"
        errors = [r.error for r in replies if isinstance(r, StageFailed | SnapshotTaken) and r.error is not None]
        if errors:
            session.snapshot = None
            self._out.append(SnapshotDone(snap.snapshot_id, session.spec, snap.boundary, snap.nbytes, errors[0]))
            return
        snap.nbytes[stage] = sum(r.nbytes for r in replies if isinstance(r, SnapshotTaken))
        if len(snap.nbytes) == len(STAGES):
            session.snapshot = None
            self._out.append(SnapshotDone(snap.snapshot_id, session.spec, snap.boundary, snap.nbytes))

    def _on_frames(self, msg: FramesReady, now: float) -> None:
        """Part of a chunk's frames: hand on all but the last part now, the last one with the chunk's
        ChunkDone (its record complete)."""
        session = self.sessions.get(msg.session_id)
        if session is None or session.spec.epoch != msg.epoch or session.state is not SessionState.RUNNING:
            self._release_acks(Stage.DECODE, [Ack.of(msg.output, "discarded")])  # nobody will show them
            return
        session.ledger.track(msg.output)
        if msg.last:
            session.last_part = msg
        else:
            self._deliver(session, msg, now, done=False)

    def _on_committed(self, stage: Stage, assignment: Assignment) -> None:
        """A DiT chunk's commit forward, after its latents went on: the stage's busy time (rank 0's,
        as for chunks); a failed one ends the session, whose caches are gone."""
        first = next(c for c in assignment.commits if c.rank == 0)
        self.lanes[stage].busy_s += first.busy_s
        error = next((c.error for c in assignment.commits if c.error is not None), None)
        session = self.sessions.get(assignment.session_id)
        if error is not None and session is not None and session.spec.epoch == assignment.epoch:
            self._fail(session, error)

    def _deliver(self, session: Session, part: FramesReady, now: float, done: bool) -> None:
        rec = session.record(part.chunk_index)
        rec.num_frames = part.offset + _frames_in(part.output)
        if part.offset == 0:
            rec.frames_ready_t = now  # the chunk's first frames are out
        self._out.append(Deliver(session.spec, part, rec, last=done))
        self._release(session, Stage.DECODE, [part.output], "copied")

    # ---- internals: closing ----

    def _lose(self, stage: Stage, error: str) -> None:
        lane = self.lanes[stage]
        if not lane.alive:
            return  # already lost (a death is seen through the pipe and the sentinel)
        lost = lane.assignment
        lane.alive, lane.assignment = False, None
        lane.queued.clear()
        self._out.append(StageLost(stage, error))
        for session in list(self.sessions.values()):
            # The dead stage's command will never reply: forget it, and give back what it was reading.
            session.computing.pop(stage, None)
            if lost is not None and lost.session_id == session.id:
                self._release_unread(session, lost, [])
            if session.state in (SessionState.OPENING, SessionState.RUNNING, SessionState.CLOSING):
                self._fail(session, error)

    def _fail(self, session: Session, error: str) -> None:
        self.counters["sessions_failed"] += 1
        if session.state is SessionState.CLOSING:
            session.error = session.error or error
        else:
            session.state, session.error = SessionState.CLOSING, error
            self._discard_queued(session)
        self._maybe_finish_close(session)

    def _discard_queued(self, session: Session) -> None:
        prompts = [session.prompt_ready, *session.prompts_at.values()]
        session.prompt_ready = None
        session.prompts_at.clear()
        encoded = [p.context for p in prompts if p is not None]
        if encoded:
            self._release(session, Stage.ENCODE, encoded, "discarded")
        if session.last_part is not None:
            self._release(session, Stage.DECODE, [session.last_part.output], "discarded")
            session.last_part = None
        for waiting, producer in ((session.encoded, Stage.ENCODE), (session.denoised, Stage.DIT)):
            while waiting:
                _, ref = waiting.popleft()
                self._release(session, producer, [ref], "discarded")

    def _maybe_finish_close(self, session: Session) -> None:
        """Once nothing is in flight, release per-stage state in reverse pipeline order."""
        if session.computing:
            return
        for stage in reversed(STAGES):
            lane = self.lanes[stage]
            if stage in session.closed:
                continue
            if not lane.alive or stage not in session.opened:
                session.closed.add(stage)
                continue
            if not any(isinstance(c, CloseSession) and c.session_id == session.id for c in lane.queued):
                lane.queued.append(CloseSession(session.id))
            return  # one stage at a time, downstream first
        if len(session.ledger) and all(lane.alive for lane in self.lanes.values()):
            self.counters["leaked_slots"] += len(session.ledger)
        final = SessionState.FAILED if session.error else SessionState.CLOSED
        self._finish(session, final, session.error)

    def _finish(self, session: Session, state: SessionState, error: str | None) -> None:
        snap, session.snapshot = session.snapshot, None
        if snap is not None:
            why = f"the session ended before its state was saved ({error or 'closed'})"
            self._out.append(SnapshotDone(snap.snapshot_id, session.spec, snap.boundary, snap.nbytes, why))
        session.state = state
        self.sessions.pop(session.id, None)
        self._out.append(Ended(session.spec, error))

    # ---- internals: slots ----

    def _release(self, session: Session, producer: Stage, refs: list[TensorRef], outcome: Outcome) -> None:
        """Release whole slots on a consumer's behalf (copied out by the engine, or discarded)."""
        for ref in refs:
            session.ledger.untrack(ref)
        self._release_acks(producer, [Ack.of(ref, outcome) for ref in refs])

    def _release_unread(self, session: Session | None, assignment: Assignment, acks: list[Ack]) -> None:
        """A failed or stale command may not have acked its inputs: give those slots back."""
        acked = {slot_key(a.ref) for a in acks}
        for producer, ref in assignment.inputs:
            key = slot_key(ref)
            if key is None or key in acked:
                continue
            if session is not None:
                session.ledger.untrack(ref)
            self._release_acks(producer, [Ack.of(ref, "discarded")])

    def _release_acks(self, producer: Stage, acks: list[Ack]) -> None:
        acks = [a for a in acks if a.ref is not None]  # inline tensors hold no slot
        if acks and self.lanes[producer].alive:
            self._out.append(ReleaseSlots(producer, tuple(acks)))

    def _flush(self) -> list[Effect]:
        out, self._out = self._out, []
        return out
