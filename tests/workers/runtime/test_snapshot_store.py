"""A worker's snapshot parts: saves written by the writer thread, off the command loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from workers.models.safetensors_writer import write_safetensors
from workers.runtime.snapshot_store import SnapshotPartMissing, SnapshotStore
from workers.session_state import StatePart

WAIT_S = 10.0


def _part(seed: int) -> StatePart:
    g = torch.Generator().manual_seed(seed)
    return StatePart(b"structure", (torch.randn(64, 32, generator=g), torch.arange(10)))


def _equal(a: StatePart, b: StatePart) -> bool:
    return a.structure == b.structure and all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))


class _Done:
    """What a save's callback got, and on which thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: str | None = None
        self.thread: threading.Thread | None = None

    def __call__(self, error: str | None) -> None:
        self.error, self.thread = error, threading.current_thread()
        self.event.set()

    def wait(self) -> str | None:
        assert self.event.wait(WAIT_S), "the save never answered"
        return self.error


def test_a_save_is_written_by_the_writer_thread_and_its_files_become_the_part(tmp_path: Path) -> None:
    store = SnapshotStore("dit0")
    try:
        store.put("s1", _part(1))
        done = _Done()
        store.keep("s1", tmp_path, done)
        assert done.wait() is None
        assert done.thread is not threading.current_thread()
        files = sorted(p.name for p in (tmp_path / "s1").iterdir())
        assert files == ["dit0.pickle", "dit0.safetensors"]
        assert _equal(store.get("s1"), _part(1))  # read back from the files: the memory is freed
        assert _equal(store.load_kept("s1", tmp_path), _part(1))
        store.drop("s1")  # forgets the part; the files are the save's
        assert (tmp_path / "s1" / "dit0.safetensors").exists()
    finally:
        store.close()


def test_a_part_not_held_is_refused_at_once(tmp_path: Path) -> None:
    store = SnapshotStore("dit0")
    with pytest.raises(SnapshotPartMissing):
        store.keep("nope", tmp_path, _Done())
    store.close()


def test_a_part_dropped_while_written_leaves_no_files_and_fails_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing, release = threading.Event(), threading.Event()
    real_save = StatePart.save

    def slow_save(self: StatePart, path: Path) -> None:  # a test double: a write that waits to be let go
        writing.set()
        assert release.wait(WAIT_S)
        real_save(self, path)

    monkeypatch.setattr(StatePart, "save", slow_save)
    store = SnapshotStore("dit0")
    try:
        store.put("s1", _part(1))
        done = _Done()
        store.keep("s1", tmp_path, done)
        assert writing.wait(WAIT_S)
        store.drop("s1")  # the command loop goes on while the writer writes
        release.set()
        assert "dropped while it was written" in (done.wait() or "")
        assert not (tmp_path / "s1").exists()
    finally:
        release.set()
        store.close()


def test_close_finishes_the_saves_asked_for(tmp_path: Path) -> None:
    store = SnapshotStore("decode0")
    answers = [_Done() for _ in range(3)]
    for i, done in enumerate(answers):
        store.put(f"s{i}", _part(i))
        store.keep(f"s{i}", tmp_path, done)
    store.close()
    assert [done.event.is_set() and done.error for done in answers] == [None, None, None]
    assert all((tmp_path / f"s{i}" / "decode0.safetensors").exists() for i in range(3))


def test_a_spilled_part_is_saved_from_its_spill_files_which_then_go(tmp_path: Path) -> None:
    store = SnapshotStore("encode0")
    try:
        store.put("s1", _part(7))
        store.spill("s1", tmp_path / "spill")
        assert (tmp_path / "spill" / "s1" / "encode0.safetensors").exists()
        done = _Done()
        store.keep("s1", tmp_path / "saves", done)
        assert done.wait() is None
        assert not (tmp_path / "spill" / "s1").exists()
        assert _equal(store.get("s1"), _part(7))
    finally:
        store.close()


def test_the_writer_writes_the_formats_own_file(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tensors = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "transposed": torch.randn(4, 6).t(),  # not contiguous
        "int": torch.arange(7),
        "bool": torch.tensor([True, False, True]),
        "fp8": torch.randn(2, 3).to(torch.float8_e4m3fn),
        "empty": torch.zeros(0, 4),
    }
    write_safetensors(tensors, tmp_path / "t.safetensors")
    back = load_file(str(tmp_path / "t.safetensors"))
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name].view(torch.uint8), t.contiguous().view(torch.uint8)), name
