"""The DiT stage's handler, run in this process (no worker, no pipe): a chunk's reply goes out before
its commit forward, and a failed commit is reported on its own and ends only its session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from workers.controls import ChunkControl
from workers.families.registry import family_for
from workers.models.presets import get_preset
from workers.parallel.group import StageGroup
from workers.runtime.channel import InlineTensor
from workers.runtime.dit_handler import DitHandler
from workers.runtime.messages import ChunkCommitted, ChunkDone, DenoiseChunk, OpenSession, Reply, SessionOpened, Stage
from workers.runtime.spec import WorkerSpec

PRESET = "tiny"


@pytest.fixture(scope="module")
def handler() -> Iterator[DitHandler]:
    spec = WorkerSpec(Stage.DIT, 0, 1, "cpu", PRESET, None, 0, os.getpid())
    h = DitHandler(spec, StageGroup(rank=0, world_size=1))
    yield h
    h.close()


def open_session(h: DitHandler, session_id: str) -> None:
    preset = get_preset(PRESET)
    tokens, width = family_for(preset).context_shape(preset)
    context = InlineTensor(torch.randn(tokens, width, generator=torch.Generator().manual_seed(0)))
    msg = OpenSession(session_id, 1, preset.chunk_latent_frames, seed=0, context=context)
    opened, *rest = h.handle(msg)
    assert isinstance(opened, SessionOpened) and rest == []


def chunk(h: DitHandler, session_id: str, k: int) -> DenoiseChunk:
    preset = get_preset(PRESET)
    c = preset.chunk_latent_frames
    cond = torch.randn(1, 20, c, preset.latent_height, preset.latent_width, generator=torch.Generator().manual_seed(k))
    return DenoiseChunk(session_id, 1, k, InlineTensor(cond), ChunkControl.from_keys(["w"]))


def test_a_chunks_reply_goes_out_before_its_commit_forward(handler: DitHandler) -> None:
    open_session(handler, "a")
    denoise = handler.sessions["a"].denoise
    replies: Iterator[Reply] = handler.handle(chunk(handler, "a", 0))
    done = next(replies)
    assert isinstance(done, ChunkDone) and done.output is not None and done.commit_follows
    assert denoise.kv_cache.committed_frames == 0  # answered; the chunk is not in the caches yet
    committed = next(replies)
    assert isinstance(committed, ChunkCommitted) and committed.error is None and committed.busy_s > 0
    assert denoise.kv_cache.committed_frames == get_preset(PRESET).chunk_latent_frames
    assert list(replies) == []


def test_a_failed_commit_is_reported_and_ends_only_its_session(handler: DitHandler, monkeypatch) -> None:
    open_session(handler, "bad")
    open_session(handler, "good")
    denoise = handler.sessions["bad"].denoise

    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(denoise, "commit_chunk", broken)
    done, committed = list(handler.handle(chunk(handler, "bad", 0)))
    assert isinstance(done, ChunkDone)
    assert isinstance(committed, ChunkCommitted)
    assert committed.error == "dit stage (rank 0) raised RuntimeError: boom"
    assert "bad" not in handler.sessions  # its caches may hold half a chunk: the session is gone
    replies = list(handler.handle(chunk(handler, "good", 0)))
    assert [type(r) for r in replies] == [ChunkDone, ChunkCommitted] and replies[1].error is None  # type: ignore[union-attr]
