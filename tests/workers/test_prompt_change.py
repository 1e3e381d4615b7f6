"""A prompt changed while a session runs: the DiT reads the new context from the next chunk on
(at once, or blended over N chunks), says so in each chunk's receipt, and a snapshot carries it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.controls import ChunkControl
from workers.serial_engine import SerialEngine, SerialSession
from workers.stages.denoise import DenoiseSession
from workers.stages.prompt_context import PromptContext

IMAGE = (np.random.default_rng(0).random((96, 160, 3)) * 255).astype(np.uint8)
WALK = ChunkControl.from_keys(["w"])


def test_a_transition_blends_the_padded_embeddings_linearly_and_ends_whole() -> None:
    old, new = torch.full((2, 3), 1.0), torch.full((3, 3), 4.0)
    context = PromptContext("day", old, text_len=4)
    assert context.next_chunk() is None and context.receipt() == {"text": "day"}
    context.change("snow", new, transition_chunks=3)
    assert context.receipt() == {"text": "snow", "weight": 0.0, "from": "day"}
    padded_old = torch.tensor([[1.0] * 3, [1.0] * 3, [0.0] * 3, [0.0] * 3])
    padded_new = torch.tensor([[4.0] * 3, [4.0] * 3, [4.0] * 3, [0.0] * 3])
    for j in (1, 2):
        read = context.next_chunk()
        assert read is not None and torch.allclose(read, padded_old + (padded_new - padded_old) * j / 3)
        assert context.receipt() == {"text": "snow", "weight": round(j / 3, 6), "from": "day"}
    read = context.next_chunk()
    assert read is not None and torch.equal(read, padded_new) and context.receipt() == {"text": "snow"}
    assert context.next_chunk() is None and context.from_embeddings is None


def test_a_change_mid_transition_starts_from_what_the_last_chunk_read() -> None:
    context = PromptContext("day", torch.zeros(1, 2), text_len=1)
    context.change("snow", torch.ones(1, 2), transition_chunks=4)
    halfway = context.next_chunk()
    assert halfway is not None and torch.allclose(halfway, torch.full((1, 2), 0.25))
    context.change("night", torch.full((1, 2), 2.0), transition_chunks=1)
    assert context.receipt() == {"text": "night", "weight": 0.0, "from": "snow"}
    assert torch.equal(context.read(), halfway)  # nothing moves until the next chunk
    assert torch.equal(context.next_chunk(), torch.full((1, 2), 2.0))


def test_too_long_a_prompt_and_no_transition_are_refused() -> None:
    with pytest.raises(ValueError, match="exceed the DiT's text length 2"):
        PromptContext("x", torch.zeros(3, 1), text_len=2)
    with pytest.raises(ValueError, match="at least 1"):
        PromptContext("x", torch.zeros(1, 1), text_len=2).change("y", torch.zeros(1, 1), 0)


@pytest.fixture(scope="module")
def engine() -> SerialEngine:
    return SerialEngine.load("tiny", cpu_threads=1)


def _walk(engine: SerialEngine, session: SerialSession, chunks: int) -> list[np.ndarray]:
    return [session.step(WALK).frames for _ in range(chunks)]


def _denoise(session: SerialSession) -> DenoiseSession:
    assert isinstance(session.denoise, DenoiseSession)
    return session.denoise


@pytest.mark.heavy
def test_the_dit_reads_the_new_prompt_from_the_next_chunk(engine: SerialEngine) -> None:
    steady = engine.create_session(IMAGE, "a quiet town", seed=0)
    changed = engine.create_session(IMAGE, "a quiet town", seed=0)
    before = _walk(engine, steady, 2)
    assert all(np.array_equal(a, b) for a, b in zip(before, _walk(engine, changed, 2), strict=True))
    engine.set_prompt(changed, "snow falls", transition_chunks=1)
    after, kept = changed.step(WALK), steady.step(WALK)
    assert after.prompt == {"text": "snow falls"} and kept.prompt == {"text": "a quiet town"}
    assert not np.array_equal(after.frames, kept.frames), "the new prompt did not reach the chunk"
    # The DiT's cross-attention K/V are those of the new prompt's embeddings, as a session opened with it has.
    fresh = engine.create_session(IMAGE, "snow falls", seed=0)
    for (k, v), (k2, v2) in zip(_denoise(changed).text_kv, _denoise(fresh).text_kv, strict=True):
        assert torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.heavy
def test_a_transition_snapshot_and_branch_continue_bit_exact(engine: SerialEngine) -> None:
    session = engine.create_session(IMAGE, "a quiet town", seed=1)
    _walk(engine, session, 1)
    engine.set_prompt(session, "night falls", transition_chunks=3)
    first = session.step(WALK)
    assert first.prompt == {"text": "night falls", "weight": round(1 / 3, 6), "from": "a quiet town"}
    saved = engine.snapshot(session)
    rest = [session.step(WALK) for _ in range(2)]
    assert [r.prompt for r in rest] == [
        {"text": "night falls", "weight": round(2 / 3, 6), "from": "a quiet town"},
        {"text": "night falls"},
    ]
    branch = engine.branch(saved)
    again = [branch.step(WALK) for _ in range(2)]
    assert [r.prompt for r in again] == [r.prompt for r in rest]
    assert all(np.array_equal(a.frames, b.frames) for a, b in zip(rest, again, strict=True))


@pytest.mark.heavy
def test_a_branch_from_before_a_change_brings_the_old_prompt_back(engine: SerialEngine) -> None:
    session = engine.create_session(IMAGE, "a quiet town", seed=2)
    _walk(engine, session, 1)
    before = engine.snapshot(session)
    engine.set_prompt(session, "fog rolls in")
    assert session.step(WALK).prompt == {"text": "fog rolls in"}
    rewound = engine.branch(before)
    steady = engine.create_session(IMAGE, "a quiet town", seed=2)
    _walk(engine, steady, 1)
    again, kept = rewound.step(WALK), steady.step(WALK)
    assert again.prompt == kept.prompt == {"text": "a quiet town"}
    assert np.array_equal(again.frames, kept.frames)
