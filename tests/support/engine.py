"""Driving a PipelineEngine from a test: a chunk collector, a session runner, the serial reference
at the workers' thread count, and the idle check every engine test ends with."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

import numpy as np

from workers.controls import ChunkControl
from workers.models.presets import TINY
from workers.runtime.engine import PipelineEngine
from workers.runtime.placement import PLACEMENTS
from workers.runtime.records import ChunkAssembler, ChunkOutput
from workers.runtime.scheduled_session import ControlSource
from workers.serial_engine import SerialEngine

IMAGE = (np.random.default_rng(1).random((TINY.height_px, TINY.width_px, 3)) * 255).astype(np.uint8)
PROMPT = "a test world"
CONTROLS = [["w"], ["w", "l"], ["a"], ["i"]]
WAIT_S = 120.0


def control_source(controls: list[list[str]] = CONTROLS) -> ControlSource:
    def source(index: int) -> tuple[ChunkControl, bool]:
        return ChunkControl.from_keys(controls[index % len(controls)], seq=index), False

    return source


@dataclass
class Collector:
    """Receives a session's chunks (whole: parts assembled) and its end on the scheduler thread."""

    events: queue.Queue = field(default_factory=queue.Queue)
    assembler: ChunkAssembler = field(default_factory=ChunkAssembler)

    def on_chunk(self, out: ChunkOutput) -> None:
        whole = self.assembler.add(out)
        if whole is not None:
            self.events.put(("chunk", whole))

    def on_end(self, session_id: str, error: str | None) -> None:
        self.events.put(("end", error))

    def collect(self, timeout_s: float = WAIT_S) -> tuple[list[ChunkOutput], str | None]:
        chunks: list[ChunkOutput] = []
        deadline = time.monotonic() + timeout_s
        while True:
            kind, value = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            if kind == "end":
                return chunks, value
            chunks.append(value)


def run_session(engine: PipelineEngine, seed: int, num_chunks: int, controls=CONTROLS) -> list[np.ndarray]:
    c = Collector()
    engine.open_session(IMAGE, PROMPT, seed, control_source(controls), c.on_chunk, c.on_end, max_chunks=num_chunks)
    chunks, error = c.collect()
    assert error is None, error
    assert [o.index for o in chunks] == list(range(num_chunks))
    return [o.frames for o in chunks]


def reference_frames(
    seed: int, num_chunks: int, controls=CONTROLS, cpu_threads: int = PLACEMENTS["cpu"].cpu_threads_per_worker
) -> list[np.ndarray]:
    """The serial engine's frames, at the thread count the compared workers run at (the contract)."""
    session = SerialEngine.load("tiny", cpu_threads=cpu_threads).create_session(IMAGE, PROMPT, seed=seed)
    return [session.step(control_source(controls)(k)[0]).frames for k in range(num_chunks)]


def assert_idle(engine: PipelineEngine) -> None:
    stats = engine.stats()
    assert stats["sessions"] == {}
    assert stats["outstanding_slots"] == 0
    assert stats["counters"]["leaked_slots"] == 0
    for name, stage in stats["stages"].items():
        assert stage["slots_in_use"] == 0, f"{name} still holds slots"
        assert stage["sessions"] == 0, f"{name} still holds session state"
