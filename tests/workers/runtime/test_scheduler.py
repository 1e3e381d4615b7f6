"""The scheduler's policy, driven with synthetic replies: no process, thread or pipe (milliseconds).

`FakeWorkers` is a test double for the three stages' workers: it answers each command the way a
worker would (outputs in made-up slots it tracks), and checks that every slot it handed out comes
back exactly once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from workers.controls import ChunkControl
from workers.runtime.channel import Ack, ShmHandle, SlotRef
from workers.runtime.chunk_rules import Schedule
from workers.runtime.effects import Deliver, Effect, Ended, ReleaseSlots, Send, SnapshotDone, StageLost
from workers.runtime.lanes import Deadlines
from workers.runtime.ledger import SlotKey, slot_key
from workers.runtime.messages import (
    STAGES,
    ChunkCommitted,
    ChunkDone,
    CloseSession,
    Command,
    DecodeChunk,
    DenoiseChunk,
    EncodeChunk,
    EncodePrompt,
    FramesReady,
    OpenSession,
    PromptEncoded,
    Reply,
    SessionClosed,
    SessionOpened,
    SnapshotTaken,
    Stage,
    StageFailed,
    TakeSnapshot,
)
from workers.runtime.records import ChunkOutput
from workers.runtime.scheduled_session import Hold, SessionSpec
from workers.runtime.scheduler import Scheduler

C = 4  # latent frames per chunk
IMAGE = np.zeros((8, 8, 3), np.uint8)
_ids = itertools.count()


@dataclass
class Viewer:
    """A session's callbacks and control source."""

    verdicts: list[object] = field(default_factory=list)  # what the control source answers, in turn
    parts: list[ChunkOutput] = field(default_factory=list)
    ended: list[str | None] = field(default_factory=list)

    def control(self, index: int) -> tuple[ChunkControl, bool] | Hold | None:
        verdict = self.verdicts.pop(0) if self.verdicts else "start"
        return (ChunkControl(seq=index), False) if verdict == "start" else verdict  # type: ignore[return-value]


@dataclass
class FakeWorkers:
    sched: Scheduler
    computing: dict[Stage, Command] = field(default_factory=dict)
    sent: list[tuple[Stage, Command]] = field(default_factory=list)
    handed_out: dict[SlotKey, Stage] = field(default_factory=dict)
    released: list[tuple[Stage, Ack]] = field(default_factory=list)
    lost: list[StageLost] = field(default_factory=list)
    snapshots: list[SnapshotDone] = field(default_factory=list)
    now: float = 0.0

    def run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                assert e.stage not in self.computing, f"{e.stage} got a command while busy"
                self.computing[e.stage] = e.command
                self.sent.append((e.stage, e.command))
            elif isinstance(e, ReleaseSlots):
                for ack in e.acks:
                    key = slot_key(ack.ref)
                    assert key is not None and self.handed_out.pop(key) is e.producer, f"bad release {ack}"
                    self.released.append((e.producer, ack))
            elif isinstance(e, Deliver):
                frames = np.zeros((e.part.output.shape[0], 1, 1, 3), np.uint8)  # type: ignore[union-attr]
                out = ChunkOutput(e.session.id, e.part.chunk_index, frames, e.record, e.part.offset, e.last)
                e.session.on_chunk(out)
            elif isinstance(e, StageLost):
                self.computing.pop(e.stage, None)  # the engine kills its workers
                self.lost.append(e)
            elif isinstance(e, SnapshotDone):
                self.snapshots.append(e)
            else:
                assert isinstance(e, Ended)
                e.session.on_end(e.session.id, e.error)

    def slot(self, stage: Stage, rows: int = 1) -> SlotRef:
        ref = SlotRef("ch", stage.value, 0, next(_ids), 0, (rows,), "uint8", "cpu", ShmHandle("x", 1))
        self.handed_out[slot_key(ref)] = stage  # type: ignore[index]
        return ref

    def step(self, dt: float = 0.01) -> None:
        self.now += dt
        self.run(self.sched.dispatch(self.now))

    def reply(self, stage: Stage, *replies: Reply) -> None:
        del self.computing[stage]
        for r in replies:
            self.run(self.sched.on_reply(stage, 0, r, self.now))

    def finish(self, stage: Stage) -> None:
        """The worker's normal answer to what it is computing."""
        cmd = self.computing[stage]
        if isinstance(cmd, OpenSession):
            context = self.slot(stage) if stage is Stage.ENCODE and cmd.snapshot is None else None
            acks = (Ack(cmd.context),) if isinstance(cmd.context, SlotRef) else ()
            self.reply(stage, SessionOpened(stage, 0, cmd.session_id, cmd.epoch, context=context, acks=acks))
        elif isinstance(cmd, CloseSession):
            self.reply(stage, SessionClosed(stage, 0, cmd.session_id))
        elif isinstance(cmd, TakeSnapshot):
            self.reply(stage, SnapshotTaken(stage, 0, cmd.session_id, cmd.epoch, cmd.snapshot_id, 100))
        elif isinstance(cmd, EncodeChunk):
            self.reply(stage, ChunkDone(stage, 0, cmd.session_id, cmd.epoch, cmd.chunk_index, 0.1, self.slot(stage)))
        elif isinstance(cmd, EncodePrompt):
            self.reply(stage, PromptEncoded.answer(cmd, stage, 0, self.slot(stage), 0.05))
        elif isinstance(cmd, DenoiseChunk):
            out = self.slot(stage)
            read = (cmd.cond,) if cmd.prompt is None else (cmd.cond, cmd.prompt.context)
            acks = tuple(Ack(ref) for ref in read)
            s, e, k = cmd.session_id, cmd.epoch, cmd.chunk_index
            done = ChunkDone(stage, 0, s, e, k, 0.5, out, acks, commit_follows=True)
            self.reply(stage, done, ChunkCommitted(stage, 0, s, e, k, 0.1))
        else:
            assert isinstance(cmd, DecodeChunk)
            s, e, k = cmd.session_id, cmd.epoch, cmd.chunk_index
            first = 5 if k == 0 else 4  # the first chunk's first part is latent frames 0 + 1
            self.reply(
                stage,
                FramesReady(stage, 0, s, e, k, 0, False, self.slot(stage, first)),
                FramesReady(stage, 0, s, e, k, first, True, self.slot(stage, 4 * C - first - (3 if k == 0 else 0))),
                ChunkDone(stage, 0, s, e, k, 0.3, None, (Ack(cmd.latents),)),
            )

    def drain(self, max_steps: int = 500) -> None:
        """Run until nothing is left to do, downstream first, as fast workers would."""
        for _ in range(max_steps):
            self.step()
            if not self.computing:
                return
            for stage in reversed(STAGES):
                if stage in self.computing:
                    self.finish(stage)
        raise AssertionError("the pipeline did not settle")


def open_session(
    fw: FakeWorkers, viewer: Viewer, max_chunks: int | None = None, snapshot: str | None = None, first_chunk: int = 0
) -> SessionSpec:
    spec = SessionSpec(
        id=f"s{next(_ids)}",
        epoch=fw.sched.next_epoch(),
        seed=0,
        chunk_latent_frames=C,
        image=IMAGE,
        prompt="",
        control_source=viewer.control,
        on_chunk=viewer.parts.append,
        on_end=lambda sid, error: viewer.ended.append(error),
        max_chunks=max_chunks,
        snapshot=snapshot,
        first_chunk=first_chunk,
    )
    fw.run(fw.sched.open(spec))
    return spec


def make(schedule: Schedule = Schedule.PIPELINED, deadlines: Deadlines | None = None) -> FakeWorkers:
    sched = Scheduler({s: 1 for s in STAGES}, schedule, deadlines=deadlines)
    for s in STAGES:
        sched.stage_up(s, 0.0)
    return FakeWorkers(sched)


def commands(fw: FakeWorkers, kind: type, session_id: str | None = None) -> list[tuple[Stage, Command]]:
    return [(s, c) for s, c in fw.sent if isinstance(c, kind) and session_id in (None, c.session_id)]


def test_a_session_runs_to_its_end_in_order_and_every_slot_comes_back() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=3)
    fw.drain()
    assert viewer.ended == [None]
    # Parts in order, the last of each chunk with its record complete.
    assert [(p.index, p.offset, p.last) for p in viewer.parts] == [
        (k, o, o > 0) for k in range(3) for o in ((0, 5) if k == 0 else (0, 4))
    ]
    assert all(p.record.num_frames == p.offset + len(p.frames) for p in viewer.parts if p.last)
    assert [p.record.control.seq for p in viewer.parts if p.last] == [0, 1, 2]  # type: ignore[union-attr]
    # Closed downstream first, one stage at a time, after the DiT had opened with the encoder's text.
    assert [s for s, _ in commands(fw, CloseSession)] == [Stage.DECODE, Stage.DIT, Stage.ENCODE]
    assert [s for s, _ in commands(fw, OpenSession)] == [Stage.DECODE, Stage.ENCODE, Stage.DIT]
    assert fw.handed_out == {} and fw.sched.counters == {
        "late_results_dropped": 0,
        "leaked_slots": 0,
        "sessions_failed": 0,
        "stages_hung": 0,
    }
    assert spec.id not in fw.sched.sessions and fw.sched.outstanding_slots() == 0


def test_encode_runs_ahead_by_prefetch_and_the_dit_by_the_edge_capacity() -> None:
    fw, viewer = make(), Viewer()
    open_session(fw, viewer)
    for stage in (Stage.DECODE, Stage.ENCODE):
        fw.step()
        fw.finish(stage)
    fw.step()
    fw.finish(Stage.DIT)  # opened
    for _ in range(6):  # the DiT never finishes: encode stops 2 conditions ahead
        fw.step()
        if Stage.ENCODE in fw.computing:
            fw.finish(Stage.ENCODE)
    assert len(commands(fw, EncodeChunk)) == 3  # chunk 0 went into the DiT, 1 and 2 wait for it
    for _ in range(10):  # now decode never finishes: the DiT stops with 2 latents waiting for (or in) decode
        fw.step()
        for stage in (Stage.DIT, Stage.ENCODE):
            if stage in fw.computing:
                fw.finish(stage)
    assert len(commands(fw, DecodeChunk)) == 1 and len(commands(fw, DenoiseChunk)) == 2
    assert len(commands(fw, EncodeChunk)) == 4  # and encode stays 2 ahead of the DiT


def test_sessions_share_each_stage_round_robin() -> None:
    fw = make()
    a, b = Viewer(), Viewer()
    sa, sb = open_session(fw, a, max_chunks=3), open_session(fw, b, max_chunks=3)
    fw.drain()
    order = [c.session_id for _, c in commands(fw, DenoiseChunk)]
    assert order == [sa.id, sb.id] * 3
    assert a.ended == b.ended == [None] and fw.handed_out == {}


def test_serial_schedule_starts_a_chunk_only_once_the_previous_one_is_out() -> None:
    fw, viewer = make(Schedule.SERIAL), Viewer()
    open_session(fw, viewer, max_chunks=3)
    fw.drain()
    kinds = [type(c).__name__ for _, c in fw.sent if isinstance(c, EncodeChunk | DenoiseChunk | DecodeChunk)]
    assert kinds == ["EncodeChunk", "DenoiseChunk", "DecodeChunk"] * 3
    assert viewer.ended == [None] and fw.handed_out == {}


def test_control_source_holds_the_dit() -> None:
    fw, viewer = make(), Viewer(verdicts=["start", Hold(0.3), None])
    open_session(fw, viewer, max_chunks=2)
    for _ in range(8):
        fw.step()
        for stage in reversed(STAGES):
            if stage in fw.computing and not (stage is Stage.DIT and len(commands(fw, DenoiseChunk)) > 1):
                fw.finish(stage)
    # Chunk 1 was held twice: once until a time (the engine wakes for it), once until the next pass.
    assert len(commands(fw, DenoiseChunk)) == 2
    fw.drain()
    assert viewer.ended == [None]
    c = make()
    c.sched.dispatch(5.0)
    assert c.sched.retry_at == float("inf")  # nothing held: nothing to wake for


def test_a_failing_chunk_ends_only_its_session_and_gives_its_slots_back() -> None:
    fw = make()
    bad, good = Viewer(), Viewer()
    sbad = open_session(fw, bad)
    open_session(fw, good, max_chunks=2)
    for _ in range(200):
        fw.step()
        cmd = fw.computing.get(Stage.DIT)
        if isinstance(cmd, DenoiseChunk) and cmd.session_id == sbad.id and cmd.chunk_index == 1:
            fw.reply(Stage.DIT, StageFailed(Stage.DIT, 0, sbad.id, "dit stage (rank 0): boom", fatal=False))
            continue
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
        if bad.ended and good.ended:
            break
    assert bad.ended == ["dit stage (rank 0): boom"] and good.ended == [None]
    assert fw.handed_out == {} and fw.sched.counters["sessions_failed"] == 1
    assert fw.sched.counters["leaked_slots"] == 0


def test_a_chunks_latents_go_on_before_its_commit_and_the_dit_takes_nothing_else_meanwhile() -> None:
    fw = make()
    a, b = Viewer(), Viewer()
    sa = open_session(fw, a)
    open_session(fw, b)
    cmd = None
    for _ in range(200):
        fw.step()
        cmd = fw.computing.get(Stage.DIT)
        if isinstance(cmd, DenoiseChunk) and cmd.session_id == sa.id and cmd.chunk_index == 1:
            break
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
    assert isinstance(cmd, DenoiseChunk)
    if Stage.DECODE in fw.computing:
        fw.finish(Stage.DECODE)  # chunk 0's decode: the decode stage is free for chunk 1
    lane = fw.sched.lanes[Stage.DIT]
    busy = lane.busy_s
    done = ChunkDone(Stage.DIT, 0, sa.id, sa.epoch, 1, 0.5, fw.slot(Stage.DIT), (Ack(cmd.cond),), commit_follows=True)
    sent_before = len(fw.sent)
    fw.run(fw.sched.on_reply(Stage.DIT, 0, done, fw.now))
    for _ in range(5):
        fw.step()
    # The latents went to the decode; the DiT, still committing, got no command, so session b's
    # next chunk has not taken its controls.
    decodes = [c for _, c in commands(fw, DecodeChunk, sa.id) if c.chunk_index == 1]
    assert len(decodes) == 1 and lane.assignment is not None
    assert [c for _, c in fw.sent[sent_before:] if isinstance(c, DenoiseChunk)] == []
    del fw.computing[Stage.DIT]
    fw.run(fw.sched.on_reply(Stage.DIT, 0, ChunkCommitted(Stage.DIT, 0, sa.id, sa.epoch, 1, 0.2), fw.now))
    assert lane.assignment is None and lane.busy_s == pytest.approx(busy + 0.5 + 0.2)
    for _ in range(5):  # now the DiT takes the next chunk (the other stages at their pace)
        fw.step()
        if isinstance(fw.computing.get(Stage.DIT), DenoiseChunk):
            break
        for stage in (Stage.DECODE, Stage.ENCODE):
            if stage in fw.computing:
                fw.finish(stage)
    assert isinstance(fw.computing.get(Stage.DIT), DenoiseChunk) and a.ended == b.ended == []


def test_a_dead_stage_fails_every_session() -> None:
    fw = make()
    a, b = Viewer(), Viewer()
    open_session(fw, a)
    open_session(fw, b)
    for _ in range(20):
        fw.step()
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
    fw.computing.pop(Stage.DECODE, None)  # its process is gone
    fw.run(fw.sched.stage_down(Stage.DECODE, "decode worker died (killed or crashed)"))
    fw.drain()
    assert a.ended == b.ended == ["decode worker died (killed or crashed)"]
    assert not fw.sched.lanes[Stage.DECODE].alive and fw.sched.sessions == {}
    # The dead stage's own slots die with it; every other producer got its slots back.
    assert all(stage is Stage.DECODE for stage in fw.handed_out.values())


def warmed(deadlines: Deadlines) -> tuple[FakeWorkers, Viewer]:
    """A running session whose stages have each answered a few commands of every kind in 0.01 s."""
    fw, viewer = make(deadlines=deadlines), Viewer()
    open_session(fw, viewer)
    for _ in range(12):
        fw.step()
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
    return fw, viewer


def test_a_stage_that_misses_its_deadline_is_lost_and_fails_the_sessions() -> None:
    deadlines = Deadlines(floor_s=1.0, factor=4.0, first_s=60.0)
    fw, viewer = warmed(deadlines)
    fw.step()  # the DiT gets its next chunk, and never answers; the others do
    for stage in (Stage.DECODE, Stage.ENCODE):
        if stage in fw.computing:
            fw.finish(stage)
    hung = fw.sched.lanes[Stage.DIT].assignment
    assert hung is not None
    assert hung.deadline_t - hung.sent_t == pytest.approx(1.0)  # 4 × 0.01 s is under the floor
    assert fw.sched.retry_at <= hung.deadline_t  # the engine wakes for it
    fw.step(0.99 - (fw.now - hung.sent_t))  # not yet
    assert fw.lost == [] and viewer.ended == []
    fw.step(0.02)
    assert [e.stage for e in fw.lost] == [Stage.DIT] and "dit stage hung" in fw.lost[0].error
    fw.drain()
    assert viewer.ended == [fw.lost[0].error] and fw.sched.counters["stages_hung"] == 1
    assert not fw.sched.lanes[Stage.DIT].alive
    # Nothing the hung stage was reading is left held: only its own outputs died with it.
    assert all(stage is Stage.DIT for stage in fw.handed_out.values())


def test_a_slow_stage_that_keeps_answering_is_not_hung() -> None:
    # Each answer takes 0.8 × the budget the previous ones earned: slow, never late.
    fw, viewer = warmed(Deadlines(floor_s=0.05, factor=2.0, first_s=60.0))
    for _ in range(30):
        fw.step()
        for stage in reversed(STAGES):
            a = fw.sched.lanes[stage].assignment
            if stage in fw.computing and a is not None:
                fw.now = a.sent_t + 0.8 * (a.deadline_t - a.sent_t)
                fw.finish(stage)
    assert fw.lost == [] and viewer.ended == []
    assert len(viewer.parts) > 10


def test_first_commands_and_restarted_stages_get_the_first_call_budget() -> None:
    deadlines = Deadlines(floor_s=1.0, factor=4.0, first_s=60.0)
    fw = make(deadlines=deadlines)
    open_session(fw, Viewer())
    fw.step()
    first = fw.sched.lanes[Stage.DECODE].assignment
    assert first is not None and first.deadline_t - first.sent_t == 60.0
    fw, _ = warmed(deadlines)
    fw.run(fw.sched.stage_down(Stage.DECODE, "decode worker died"))
    fw.drain()
    fw.sched.stage_up(Stage.DECODE, fw.now)  # new workers: first calls again
    open_session(fw, Viewer())
    fw.step()
    again = fw.sched.lanes[Stage.DECODE].assignment
    assert again is not None and again.deadline_t - again.sent_t == 60.0


def test_closing_while_opening_drops_the_late_reply_and_frees_its_output() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer)
    fw.step()  # decode and encode are opening it
    fw.run(fw.sched.close(spec.id))
    assert viewer.ended == [None]  # nothing had opened yet: nothing to close
    fw.finish(Stage.DECODE)
    fw.finish(Stage.ENCODE)  # its prompt embeddings come back for a session that is gone
    assert fw.sched.counters["late_results_dropped"] == 2
    assert fw.handed_out == {}  # the embeddings' slot was handed back at once


def test_closing_mid_chunk_discards_queued_work_and_closes_in_reverse() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer)
    for _ in range(12):
        fw.step()
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
    fw.run(fw.sched.close(spec.id))
    fw.drain()
    assert viewer.ended == [None] and fw.handed_out == {}
    closes = [s for s, c in commands(fw, CloseSession)]
    assert closes == [Stage.DECODE, Stage.DIT, Stage.ENCODE]
    assert fw.sched.counters["leaked_slots"] == 0


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Scheduler({s: 1 for s in STAGES}, prefetch_chunks=0)


def prompts_taken(fw: FakeWorkers) -> list[tuple[int, str | None]]:
    return [(c.chunk_index, None if c.prompt is None else c.prompt.text) for _, c in commands(fw, DenoiseChunk)]


def test_a_prompt_is_encoded_at_once_and_taken_by_the_dits_next_chunk_latest_wins() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=6)
    for _ in range(6):  # open, and a chunk or two under way
        fw.step()
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
    started = len(commands(fw, DenoiseChunk))
    fw.run(fw.sched.set_prompt(spec.id, "rain"))
    fw.run(fw.sched.set_prompt(spec.id, "snow", transition_chunks=3))  # before the first was sent
    fw.drain()
    sent = [(c.version, c.text, c.transition_chunks) for _, c in commands(fw, EncodePrompt)]
    assert sent == [(2, "snow", 3)]  # the older one never reached the encoder
    taken = prompts_taken(fw)
    assert [text for _, text in taken if text is not None] == ["snow"]  # once, by one chunk
    assert next(k for k, text in taken if text is not None) >= started  # never a chunk already started
    assert viewer.ended == [None] and fw.handed_out == {} and fw.sched.counters["leaked_slots"] == 0


def test_an_encoded_prompt_overtaken_before_the_dit_took_it_is_handed_back() -> None:
    fw, viewer = make(), Viewer(verdicts=["start"] + [None] * 40)  # the DiT holds chunk 1 back
    spec = open_session(fw, viewer, max_chunks=3)
    fw.drain()
    fw.run(fw.sched.set_prompt(spec.id, "night"))
    fw.step()
    fw.finish(Stage.ENCODE)
    fw.run(fw.sched.set_prompt(spec.id, "fog"))
    fw.step()
    fw.finish(Stage.ENCODE)
    assert [a.outcome for stage, a in fw.released if stage is Stage.ENCODE][-1] == "discarded"
    viewer.verdicts.clear()
    fw.drain()
    assert [text for _, text in prompts_taken(fw) if text is not None] == ["fog"]
    assert fw.handed_out == {} and fw.sched.counters["leaked_slots"] == 0


def test_closing_with_a_prompt_waiting_gives_its_slot_back() -> None:
    fw, viewer = make(), Viewer(verdicts=["start"] + [None] * 40)
    spec = open_session(fw, viewer)
    fw.drain()
    fw.run(fw.sched.set_prompt(spec.id, "dusk"))
    fw.step()
    fw.finish(Stage.ENCODE)
    fw.run(fw.sched.close(spec.id))
    fw.drain()
    assert viewer.ended == [None] and fw.handed_out == {} and fw.sched.counters["leaked_slots"] == 0
    fw.run(fw.sched.set_prompt(spec.id, "ignored"))  # a session that is gone: nothing happens
    assert fw.computing == {}


def test_a_replays_prompt_changes_reach_exactly_their_chunks_and_the_dit_waits_for_them() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=6)
    fw.run(fw.sched.set_prompt(spec.id, "rain", at_chunk=1))  # while the session opens
    with pytest.raises(ValueError, match="too late or twice"):
        fw.sched.set_prompt(spec.id, "again", at_chunk=1)
    while len(commands(fw, DenoiseChunk)) < 2:  # chunks 0 and 1 under way, later ones encoded ahead
        fw.step()
        for stage in reversed(STAGES):
            if stage in fw.computing:
                fw.finish(stage)
    fw.run(fw.sched.set_prompt(spec.id, "snow", transition_chunks=2, at_chunk=2))
    for _ in range(30):  # the encoder sits on the prompt: the DiT finishes chunk 1, then waits
        fw.step()
        for stage in (Stage.DECODE, Stage.DIT):
            if stage in fw.computing:
                fw.finish(stage)
    assert isinstance(fw.computing.get(Stage.ENCODE), EncodePrompt)
    assert 2 in [c.chunk_index for _, c in commands(fw, EncodeChunk)]  # its condition is there: the prompt is not
    assert [c.chunk_index for _, c in commands(fw, DenoiseChunk)] == [0, 1]
    fw.drain()
    assert [(k, text) for k, text in prompts_taken(fw) if text is not None] == [(1, "rain"), (2, "snow")]
    changes = [c.prompt for _, c in commands(fw, DenoiseChunk) if c.prompt is not None]
    assert [(c.transition_chunks, c.at_chunk) for c in changes] == [(1, 1), (2, 2)]
    assert viewer.ended == [None] and fw.handed_out == {} and fw.sched.counters["leaked_slots"] == 0
