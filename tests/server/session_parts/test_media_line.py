"""The media line (server/session/media_line.py) on its own: parts of chunks into the pacer, a `chunk` message
once a chunk's last part is in (its frames and pts placed exactly), the recording fed, the dispatcher
told, control-to-frame measured at the first frame's emit, `behind` from recent periods, and a rewind
that discards the abandoned future."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from server.common.metrics import Metrics
from server.media.recording import ChunkEntry
from server.media.timeline import SessionTimeline
from server.session import media_line
from server.session.control_source import ControlSource
from server.session.media_line import BEHIND_MIN_CHUNKS, MediaLine
from server.wire.dispatch import DispatchConfig, DispatchPolicy
from workers.controls import ChunkControl, ControlMsg
from workers.runtime.records import ChunkOutput, ChunkRecord

FPS, CHUNK_LATENT = 16, 3


class FakeClock:
    """Test double for the module's clock (time.monotonic, time.perf_counter)."""

    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def perf_counter(self) -> float:
        return self.t


class FakeRecording:
    """Test double for SessionRecording: what the line handed it."""

    def __init__(self) -> None:
        self.frames_in: list[tuple[int, int, bool]] = []
        self.taken: list[int] = []
        self.rewound: list[list[ChunkEntry]] = []
        self.closed = False

    def frames(self, index: int, frames: np.ndarray, last: bool) -> None:
        self.frames_in.append((index, int(frames.shape[0]), last))

    def control_taken(self, index: int, control: ChunkControl, reset: bool) -> None:
        self.taken.append(index)

    def rewind(self, history: list[ChunkEntry]) -> None:
        self.rewound.append(history)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(media_line, "time", fake)
    return fake


def line_of(frames_before: int = 0) -> tuple[MediaLine, ControlSource, FakeRecording]:
    controls = ControlSource(DispatchConfig(DispatchPolicy.JIT, FPS, CHUNK_LATENT), on_taken=lambda *_: None)
    line = MediaLine(FPS, CHUNK_LATENT, controls, Metrics(), frames_before)
    recording = FakeRecording()
    line.open(recording, SessionTimeline(100.0, 100.0), [])  # type: ignore[arg-type]
    return line, controls, recording


def part(index: int, n: int, offset: int = 0, last: bool = True, seq: int | None = None) -> ChunkOutput:
    control = None if seq is None else ChunkControl(keys=frozenset({"w"}), seq=seq)
    frames = np.zeros((n, 8, 8, 3), np.uint8)
    return ChunkOutput("engine-1", index, frames, ChunkRecord(index, control=control), offset=offset, last=last)


async def test_a_chunk_in_two_parts_is_placed_exactly_and_recorded(clock: FakeClock) -> None:
    line, controls, recording = line_of(frames_before=24)
    controls.sample(0)
    assert line.push(part(0, 5, last=False, seq=4)) is None
    assert line.first_frames_t == 100.0
    clock.t += 0.05
    msg = line.push(part(0, 7, offset=5, seq=4))
    assert msg is not None
    step = line.pacer.pts_step
    assert (msg.index, msg.first_frame, msg.num_frames) == (0, 24, 12)
    assert msg.parts == [(24, 0, 5), (29, 5 * step, 7)] and msg.pts_end == 11 * step
    assert msg.applied_seq == 4 and msg.applied_keys == ["w"]
    assert msg.timings["start_to_pacer_s"] is not None  # the dispatcher heard of it
    assert recording.frames_in == [(0, 5, False), (0, 7, True)]
    line.control_taken(1, ChunkControl(), False)
    assert recording.taken == [1] and line.figures()["chunks"] == 1
    await line.close()
    assert recording.closed and line.pacer.closed


async def test_control_to_frame_runs_from_arrival_to_the_first_frame_out(clock: FakeClock) -> None:
    line, controls, _ = line_of()
    controls.apply(ControlMsg(type="control", key="w", action="press", seq=3), now=99.0)
    line.push(part(0, 12, seq=3))
    assert line.figures()["control_to_frame_p50_s"] is None  # not on screen yet
    frame = line.pacer.next_frame(now=100.25)
    assert frame is not None and frame.frame_index == 0
    assert line.figures()["control_to_frame_p50_s"] == pytest.approx(1.25)
    assert line.timeline is not None and len(line.timeline.controls) == 1
    await line.close()


async def test_behind_once_enough_periods_are_over_the_chunks_duration(clock: FakeClock) -> None:
    line, _, _ = line_of()
    media_s = line.chunk_media_s
    for index in range(BEHIND_MIN_CHUNKS + 1):
        line.push(part(index, 12))
        clock.t += 1.5 * media_s
        assert line.behind is (index >= BEHIND_MIN_CHUNKS)
    figures: dict[str, Any] = line.figures()
    assert figures["real_time_factor"] == pytest.approx(1.5)
    assert figures["chunk_period_p50_s"] == pytest.approx(1.5 * media_s)
    await line.close()


async def test_a_rewind_discards_the_queued_future_and_goes_on_from_the_snapshot(clock: FakeClock) -> None:
    line, _, recording = line_of()
    line.push(part(0, 12))
    line.push(part(1, 6, last=False))
    history = [ChunkEntry(0, ["w"], [0.0, 0.0], False)]
    assert line.rewind(frames=12, history=history) == 18
    assert recording.rewound == [history]
    msg = line.push(part(1, 12))
    assert msg is not None and msg.first_frame == 12 and msg.parts == [(12, 0, 12)]  # no stale part of chunk 1
    await line.close()


def test_a_stream_whose_first_chunk_is_the_start_image_alone_starts_with_two_chunks() -> None:
    # One-latent chunks: 1 frame, then 4; longer chunks' first chunk (5, 9, 13 frames) starts at once.
    assert [media_line.start_frames(c) for c in (1, 2, 3, 4)] == [5, 1, 1, 1]
    controls = ControlSource(DispatchConfig(DispatchPolicy.JIT, FPS, 1), on_taken=lambda *_: None)
    assert MediaLine(FPS, 1, controls, Metrics(), 0).pacer.start_frames == 5
