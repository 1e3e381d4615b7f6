"""Saves on disk (server/snapshots/saves.py) without a server: written whole or not at all, read back
as they were, a changed byte reported by its checksum, the oldest removed past the quota."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from server.media.recording import ChunkEntry
from server.snapshots.saves import MANIFEST, SavedSnapshots
from server.snapshots.snapshot import MadeWith, Origin, ServerSnapshot
from server.wire.protocol import Parent

MADE = MadeWith("gridworld", "sha256:abc", "cpu", 1)


def snapshot(snapshot_id: str, created: float = 100.0) -> ServerSnapshot:
    image = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    origin = Origin(image, "it starts to snow", 7, 16, 4, "main-street", line="line0")
    history = [ChunkEntry(0, ["w"], [0.0, 0.0], False, "d0"), ChunkEntry(1, [], [1.5, 0.0], False, "d1", {"text": "x"})]
    parent = Parent(snapshot_id="0" * 16, session_id="s0", chunk_index=1)
    return ServerSnapshot(snapshot_id, "s1", 2, 1234, created, origin, parent, history, MADE)


def parts(root: Path, snapshot_id: str, size: int = 64) -> None:
    """What the workers write before the server completes a save."""
    folder = root / snapshot_id
    folder.mkdir(parents=True)
    for name in ("encode0", "dit0", "decode0"):
        (folder / f"{name}.pickle").write_bytes(b"p" * 8)
        (folder / f"{name}.safetensors").write_bytes(os.urandom(size))


def test_a_save_reads_back_as_it_was_written(tmp_path: Path) -> None:
    saves = SavedSnapshots(tmp_path, quota_bytes=2**30)
    parts(tmp_path, "a" * 16)
    original = snapshot("a" * 16)
    saves.write(original, MADE, ["h1", "h2"])
    scan = saves.scan()
    assert scan.corrupt == {} and scan.removed == [] and len(scan.found) == 1
    found = scan.found[0]
    back = found.snapshot
    assert np.array_equal(back.origin.image, original.origin.image) and back.origin.image.dtype == np.uint8
    assert (back.origin.prompt, back.origin.seed, back.origin.line) == ("it starts to snow", 7, "line0")
    assert back.history == original.history and back.parent == original.parent and back.made_with == MADE
    assert (back.chunk_index, back.frames, back.nbytes) == (2, original.frames, 1234)
    assert found.token_sha256 == ["h1", "h2"] and found.directory == tmp_path
    saves.update_tokens("a" * 16, ["h3"])
    assert saves.scan().found[0].token_sha256 == ["h1", "h2", "h3"], "a new token keeps the manifest whole"


def test_an_interrupted_save_is_removed_and_a_changed_byte_is_reported(tmp_path: Path) -> None:
    saves = SavedSnapshots(tmp_path, quota_bytes=2**30)
    parts(tmp_path, "b" * 16)  # the workers wrote their parts, the server never wrote its manifest
    parts(tmp_path, "c" * 16)
    saves.write(snapshot("c" * 16), MADE, ["h"])
    part = tmp_path / ("c" * 16) / "dit0.safetensors"
    data = bytearray(part.read_bytes())
    data[10] ^= 1
    part.write_bytes(bytes(data))
    scan = saves.scan()
    assert scan.removed == ["b" * 16] and not (tmp_path / ("b" * 16)).exists()
    assert scan.found == [] and list(scan.corrupt) == ["c" * 16]
    line, hashes, why = scan.corrupt["c" * 16]
    assert (line, hashes) == ("line0", ["h"]) and "checksum of dit0.safetensors" in why
    assert (tmp_path / ("c" * 16)).is_dir(), "a corrupt save is left for the operator"
    manifest = json.loads((tmp_path / ("c" * 16) / MANIFEST).read_text())
    assert set(manifest["files"]) >= {"meta.json", "image.npy", "dit0.safetensors"}


def test_the_oldest_saves_go_first_past_the_quota(tmp_path: Path) -> None:
    saves = SavedSnapshots(tmp_path, quota_bytes=5500)
    for i, sid in enumerate(("e" * 16, "d" * 16, "f" * 16)):  # d is the oldest, though not the first written
        parts(tmp_path, sid, size=300)
        saves.write(snapshot(sid, created=1000.0 - 10 * (sid == "d" * 16) + i), MADE, [])
    sizes = {p.name: sum(f.stat().st_size for f in p.iterdir()) for p in tmp_path.iterdir()}
    assert sum(sizes.values()) > 5500 >= sizes["f" * 16] + sizes["e" * 16]
    assert saves.over_quota() == ["d" * 16]
