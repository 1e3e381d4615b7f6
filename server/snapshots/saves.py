"""Saves that outlive the server: snapshots written under WORLDRTC_SNAPSHOT_DIR.

A save is one directory, `<dir>/<snapshot_id>/`:

    encode0.pickle, encode0.safetensors, dit0.…, decode0.…   each worker's part (workers/runtime/snapshot_store.py)
    image.npy                                                 the line's start image, exactly
    meta.json                                                 the rest of the snapshot (snapshots/snapshot.py),
                                                              its recording prefix, what it was made with, and the
                                                              SHA-256 of each token of its line (never a token)
    manifest.json                                             the SHA-256 and size of every file above

The manifest is written last, to a temporary name renamed into place: a save without one was
interrupted (a crash mid-write) and is removed at the next start, never served. At start every
manifest is checked against its files; a save whose files differ is reported corrupt (its owner's
requests answer 410 saying so) and left on disk for the operator. The directory is kept within
its quota by removing the oldest saves first.

What a branch needs to reproduce the frames bit for bit (workers/determinism.py) is recorded as
`made_with`: a save from other weights, another placement or thread count is listed, but a branch
from it is refused (409) naming what differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.media.recording import ChunkEntry
from server.snapshots.snapshot import MadeWith, Origin, ServerSnapshot
from server.wire.protocol import Parent

log = logging.getLogger("worldrtc.saves")

SAVE_FORMAT = 1
MANIFEST = "manifest.json"
META = "meta.json"
IMAGE = "image.npy"


@dataclass(frozen=True)
class FoundSave:
    """A save read back at start: its snapshot and its line's token hashes."""

    snapshot: ServerSnapshot
    chunk_latent_frames: int
    token_sha256: list[str]
    directory: Path


@dataclass(frozen=True)
class Scan:
    found: list[FoundSave]
    corrupt: dict[str, tuple[str, list[str], str]]  # id -> (line, token hashes, why), for the owner's 410
    removed: list[str]  # interrupted before their manifest: removed


class SavedSnapshots:
    def __init__(self, directory: Path, quota_bytes: int) -> None:
        self.directory, self.quota_bytes = directory, quota_bytes
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, snapshot: ServerSnapshot, made_with: MadeWith, token_sha256: list[str]) -> None:
        """Complete a save whose parts the workers wrote: the image, the metadata, then the manifest."""
        folder = self.directory / snapshot.snapshot_id
        np.save(folder / IMAGE, snapshot.origin.image, allow_pickle=False)
        meta = {
            "format": SAVE_FORMAT,
            "snapshot_id": snapshot.snapshot_id,
            "session_id": snapshot.session_id,
            "chunk_index": snapshot.chunk_index,
            "nbytes": snapshot.nbytes,
            "created": snapshot.created,
            "parent": None if snapshot.parent is None else snapshot.parent.model_dump(),
            "origin": {k: v for k, v in asdict(snapshot.origin).items() if k != "image"},
            "history": None if snapshot.history is None else [asdict(e) for e in snapshot.history],
            "made_with": asdict(made_with),
            "token_sha256": sorted(token_sha256),
        }
        (folder / META).write_text(json.dumps(meta))
        files = {p.name: _file_digest(p) for p in sorted(folder.iterdir()) if p.name != MANIFEST}
        tmp = folder / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps({"format": SAVE_FORMAT, "files": files}))
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)  # the save exists from here on, whole

    def update_tokens(self, snapshot_id: str, token_sha256: list[str]) -> None:
        """A line's new token (a branch of it) opens its saves after a restart too: rewrite the
        metadata's hashes and its manifest entry."""
        folder = self.directory / snapshot_id
        try:
            meta = json.loads((folder / META).read_text())
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return
        meta["token_sha256"] = sorted(set(meta["token_sha256"]) | set(token_sha256))
        (folder / META).write_text(json.dumps(meta))
        manifest["files"][META] = _file_digest(folder / META)
        tmp = folder / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest))
        os.replace(tmp, folder / MANIFEST)

    def remove(self, snapshot_id: str) -> None:
        shutil.rmtree(self.directory / snapshot_id, ignore_errors=True)

    def over_quota(self) -> list[str]:
        """Saves to remove, oldest first, so that the rest fit the quota."""
        saves = []
        for folder in self.directory.iterdir():
            if (folder / MANIFEST).is_file():
                size = sum(p.stat().st_size for p in folder.iterdir())
                try:
                    created = float(json.loads((folder / META).read_text())["created"])
                except (OSError, ValueError, KeyError):
                    created = folder.stat().st_mtime
                saves.append((created, folder.name, size))
        saves.sort()
        total = sum(size for _, _, size in saves)
        out = []
        for _, name, size in saves:
            if total <= self.quota_bytes:
                break
            out.append(name)
            total -= size
        return out

    def scan(self) -> Scan:
        """Every save in the directory, checked against its manifest."""
        found: list[FoundSave] = []
        corrupt: dict[str, tuple[str, list[str], str]] = {}
        removed: list[str] = []
        for folder in sorted(p for p in self.directory.iterdir() if p.is_dir()):
            if not (folder / MANIFEST).is_file():
                log.warning("save %s was interrupted before it was complete: removed", folder.name)
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
                continue
            try:
                why = _check(folder)
                meta = json.loads((folder / META).read_text())
            except (OSError, ValueError, KeyError) as exc:
                why, meta = f"its manifest or metadata cannot be read ({exc})", {}
            if why is not None:
                log.error("save %s is corrupt: %s; left in %s", folder.name, why, folder)
                line = meta.get("origin", {}).get("line", "")
                corrupt[folder.name] = (line, list(meta.get("token_sha256", [])), why)
                continue
            found.append(_read(folder, meta))
        return Scan(found, corrupt, removed)


def _read(folder: Path, meta: dict[str, Any]) -> FoundSave:
    origin = Origin(image=np.load(folder / IMAGE, allow_pickle=False), **meta["origin"])
    history = None if meta["history"] is None else [ChunkEntry(**e) for e in meta["history"]]
    parent = None if meta["parent"] is None else Parent(**meta["parent"])
    snapshot = ServerSnapshot(
        meta["snapshot_id"],
        meta["session_id"],
        meta["chunk_index"],
        meta["nbytes"],
        meta["created"],
        origin,
        parent,
        history,
        MadeWith(**meta["made_with"]),
    )
    return FoundSave(snapshot, origin.chunk_latent_frames, list(meta["token_sha256"]), folder.parent)


def _check(folder: Path) -> str | None:
    """Why the folder's files do not match its manifest, or None."""
    manifest = json.loads((folder / MANIFEST).read_text())
    if manifest.get("format") != SAVE_FORMAT:
        return f"it is in save format {manifest.get('format')}, this server reads {SAVE_FORMAT}"
    for name, (digest, size) in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size or _file_digest(path)[0] != digest:
            return f"the checksum of {name} differs from its manifest"
    return None


def _file_digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest(), path.stat().st_size
