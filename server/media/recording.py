"""A session's recording: the recipe that regenerates it, the control each chunk's DiT consumed, and
a digest of every chunk's frames as generated; beside it, the frames themselves as an MP4.

Frames are deterministic for a model and its weights, the placement and intra-op thread count,
the seed, the start image and the per-chunk controls (workers/determinism.py), so this JSON of a
few kilobytes regenerates the session exactly: `python -m benchmarks.replay --recording REC.json`
checks every chunk's digest. A prompt typed during the session is kept with the chunk whose DiT took
it (`prompt` {text, transition_chunks} on that chunk's entry), so the regeneration changes it there.

A branch (a session started from a snapshot, or one rewound to it) records its whole line: the first
session's recipe and the chunks before the snapshot, as that session recorded them (`history`, kept
with the snapshot), then its own. Regenerating it runs from chunk 0 and meets the branch's frames
from the snapshot on; its MP4 holds only the frames this session generated, in the order shown.

The schema (`RECORDING_SCHEMA`, versioned):
    schema, session_id, created (unix s), model, weights (workers/models/weights_digest.py),
    placement {name, stages}, intra_op_threads, seed, prompt, fps, chunk_latent_frames,
    image {sha256 of the fitted HxWx3 pixels, width, height, png (base64, while the session is listed)},
    chunks [{index, keys, look [dx, dy] px, reset_pose, frames_sha256, prompt? {text, transition_chunks}}],
    drivers [{session_id, from_chunk}]: whose session generated the chunks from each (a line branched,
        or a world handed on from driver to driver at a turn's end: `continue`),
    complete (every chunk's digest present), incomplete_reason, video {frames, bytes, complete, reason}

Work off the event loop: the recorder thread hashes each chunk's frames and encodes them into the
session's MP4 (a fragmented MP4, playable while it grows), fed through a bounded queue of frame
parts. Overflow policy: when the queue is full (the thread fell behind), the part is not queued,
the recording stops being complete from that chunk on (`incomplete_reason` says why) and the video
ends there; the live stream never waits for the recording.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from server.common.memory import trim_heap
from server.media.mp4_writer import Mp4Writer
from server.media.recording_store import RecordingStore
from workers.controls import ChunkControl

log = logging.getLogger("worldrtc.recording")

RECORDING_SCHEMA = "worldrtc.recording/1"
QUEUE_PARTS = 64  # frame parts waiting for the recorder thread: several chunks at any preset
VIDEO_CRF = 16  # near-transparent H.264: the frames as generated, not as streamed


@dataclass(frozen=True)
class Recipe:
    """What determines a session's frames, besides its per-chunk controls."""

    model: str
    weights: str
    placement: str
    placement_stages: dict[str, list[str]]
    intra_op_threads: int
    seed: int
    prompt: str
    fps: int
    chunk_latent_frames: int
    image: np.ndarray  # HxWx3 uint8, fitted to the model's resolution
    savings: dict[str, Any] = field(default_factory=dict)  # Savings.record(): they change the bits


@dataclass
class ChunkEntry:
    index: int
    keys: list[str]
    look: list[float]
    reset_pose: bool
    frames_sha256: str | None = None
    prompt: dict[str, Any] | None = None  # a prompt change the DiT took with this chunk
    session_id: str | None = None  # the session that generated it (the record's `drivers`, not per chunk)

    def record(self) -> dict[str, Any]:
        # No frame count: the chunk geometry gives it (workers/chunk_geometry.py), and a minute of a
        # session should stay within 10 kB (a prompt only where one changed).
        entry = {
            "index": self.index,
            "keys": self.keys,
            "look": [_compact(v) for v in self.look],
            "reset_pose": self.reset_pose,
            "frames_sha256": self.frames_sha256,
        }
        return entry if self.prompt is None else entry | {"prompt": self.prompt}


@dataclass
class _Part:
    index: int
    frames: np.ndarray
    last: bool
    line: int  # rewinds before it: a chunk index names another chunk after each


@dataclass
class _Video:
    frames: int = 0
    complete: bool = True
    reason: str | None = None
    writer: Mp4Writer | None = field(default=None, repr=False)


class SessionRecording:
    def __init__(self, session_id: str, recipe: Recipe, store: RecordingStore) -> None:
        self.session_id, self.recipe, self.store = session_id, recipe, store
        self.created = time.time()
        self._lock = threading.Lock()  # chunks are added on the scheduler thread, read on the loop
        self._chunks: dict[int, ChunkEntry] = {}
        self._incomplete: str | None = None
        self._incomplete_from: int | None = None  # the first chunk a part of which was not queued
        self._pending: dict[tuple[int, int], list[np.ndarray]] = {}  # recorder thread only: (line, chunk) -> parts
        self._line = 0  # rewinds so far
        h, w = recipe.image.shape[:2]
        self.video_path = store.start_video(session_id)
        # One encoder thread: the recorder is one thread beside the workers, and x264's frame threads
        # would take cores from them and warm up tens of MB of buffers per session.
        writer = Mp4Writer(self.video_path, w, h, recipe.fps, crf=VIDEO_CRF, fragmented=True, threads=1)
        self._video = _Video(writer=writer)
        self._queue: queue.Queue[_Part | None] = queue.Queue(maxsize=QUEUE_PARTS)
        self._thread = threading.Thread(target=self._run, name=f"recorder-{session_id}", daemon=True)
        self._thread.start()

    # ---- fed by the session ----

    def control_taken(self, index: int, control: ChunkControl, reset_pose: bool) -> None:
        """The control chunk `index` starts with, as the DiT will consume it (scheduler thread)."""
        look = [control.look_dx_px, control.look_dy_px]
        entry = ChunkEntry(index, sorted(control.keys), look, reset_pose, session_id=self.session_id)
        with self._lock:
            self._chunks[index] = entry

    def prompt_changed(self, index: int, change: dict[str, Any]) -> None:
        """Chunk `index`'s DiT took a prompt change (loop thread, before the chunk's frames)."""
        with self._lock:
            entry = self._chunks.get(index)
            if entry is not None:
                entry.prompt = dict(change)

    def frames(self, index: int, frames: np.ndarray, last: bool) -> None:
        """Part of chunk `index`'s frames, in order (loop thread; never blocks)."""
        if self._incomplete is not None:
            return
        try:
            self._queue.put_nowait(_Part(index, frames, last, self._line))
        except queue.Full:
            self._mark_incomplete(index, f"the recorder fell behind at chunk {index} (queue of {QUEUE_PARTS} parts)")

    def close(self) -> None:
        """Finish the video and stop the thread (blocks until the queued parts are written: call it
        off the event loop)."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join()

    def history(self, before: int, wait_s: float = 5.0) -> list[ChunkEntry]:
        """The entries of chunks before `before`, once their digests are in (the recorder thread may
        still be hashing the last ones; blocks up to `wait_s`: call it off the event loop). A chunk
        without a digest then makes the history incomplete: it ends before that chunk."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                entries = [dataclasses.replace(self._chunks[i]) for i in sorted(self._chunks) if i < before]
                broken = self._incomplete is not None
            if all(e.frames_sha256 is not None for e in entries) or broken or time.monotonic() > deadline:
                return [e for e in entries if e.frames_sha256 is not None]
            time.sleep(0.02)

    def rewind(self, history: list[ChunkEntry]) -> None:
        """From now on the line continues from a snapshot: its chunks are `history` (any later ones go)."""
        with self._lock:
            self._chunks = {e.index: dataclasses.replace(e) for e in history}
            self._line += 1

    # ---- read ----

    def record(self) -> dict[str, Any]:
        """The recording as JSON types. Encodes the start image (tens of ms at 832 × 480) on the first
        call: call it off the event loop."""
        r = self.recipe
        with self._lock:
            entries = [self._chunks[i] for i in sorted(self._chunks)]
            chunks = [e.record() for e in entries]
            incomplete = self._incomplete
        done = [c for c in chunks if c["frames_sha256"] is not None]
        image = {
            "sha256": self._image_sha256,
            "width": int(r.image.shape[1]),
            "height": int(r.image.shape[0]),
            "png": self._image_png,
        }
        video = self._video
        return {
            "schema": RECORDING_SCHEMA,
            "session_id": self.session_id,
            "created": self.created,
            "model": r.model,
            "weights": r.weights,
            "placement": {"name": r.placement, "stages": r.placement_stages},
            "intra_op_threads": r.intra_op_threads,
            "savings": r.savings,
            "seed": r.seed,
            "prompt": r.prompt,
            "fps": r.fps,
            "chunk_latent_frames": r.chunk_latent_frames,
            "image": image,
            # Only chunks whose frames were generated: a chunk started when the session closed has none.
            "chunks": done,
            "drivers": drivers(entries),
            "complete": incomplete is None,
            "incomplete_reason": incomplete,
            "video": {
                "frames": video.frames,
                "bytes": self.video_path.stat().st_size if self.video_path.exists() else 0,
                "complete": video.complete,
                "reason": video.reason,
            },
        }

    # The start image never changes: encoded once, on the first request that asks.
    @functools.cached_property
    def _image_sha256(self) -> str:
        return image_digest(self.recipe.image)

    @functools.cached_property
    def _image_png(self) -> str:
        return base64.b64encode(png_bytes(self.recipe.image)).decode()

    # ---- the recorder thread ----

    def _run(self) -> None:
        while True:
            part = self._queue.get()
            if part is None:
                break
            with self._lock:
                cut = self._incomplete_from
            if cut is not None and part.index >= cut:  # a part of this chunk was lost: no digest from here
                self._end_video(self._incomplete)
                continue
            key = (part.line, part.index)
            self._pending.setdefault(key, []).append(part.frames)
            if not part.last:
                continue
            # A whole chunk: its digest, and its frames into the video (the video and the recording
            # hold the same chunks: one cut short by the session's end is in neither).
            parts = self._pending.pop(key)
            for stale in [k for k in self._pending if k[0] < part.line]:  # cut short by a rewind
                del self._pending[stale]
            digest = hashlib.sha256()
            for frames in parts:
                digest.update(np.ascontiguousarray(frames).data)
            with self._lock:
                entry = self._chunks.get(part.index) if part.line == self._line else None
                if entry is not None:
                    entry.frames_sha256 = digest.hexdigest()
            for frames in parts:
                self._write_video(frames)
            del parts, frames
            # The frames and the encoder's scratch were freed on this thread, into its own arena,
            # which glibc keeps: trimmed here, a session's recording leaves the server's RSS flat.
            trim_heap()
        self._end_video(None)

    def _write_video(self, frames: np.ndarray) -> None:
        video = self._video
        if video.writer is None:
            return
        if not self.store.has_room(self.session_id):
            self._end_video(f"the recording directory is full ({self.store.quota_bytes / 2**20:g} MiB quota)")
            return
        try:
            video.writer.write(frames)
            video.frames += len(frames)
        except (OSError, ValueError) as exc:  # disk full, or the encoder gave up
            self._end_video(f"writing the video failed: {exc}")

    def _end_video(self, reason: str | None) -> None:
        video = self._video
        if video.writer is None:
            return
        writer, video.writer = video.writer, None
        if reason is not None:
            video.complete, video.reason = False, reason
            log.warning("session %s: the video stops: %s", self.session_id, reason)
        try:
            writer.close()
        except (OSError, ValueError) as exc:
            video.complete, video.reason = False, f"finishing the video failed: {exc}"
        self.store.finished(self.session_id)

    def _mark_incomplete(self, index: int, reason: str) -> None:
        with self._lock:
            if self._incomplete is None:
                self._incomplete, self._incomplete_from = reason, index
        log.warning("session %s: recording incomplete: %s", self.session_id, reason)


def drivers(entries: list[ChunkEntry]) -> list[dict[str, Any]]:
    """Each driver's span of a line: the session that generated the chunks from `from_chunk` on."""
    spans: list[dict[str, Any]] = []
    for e in entries:
        if not spans or spans[-1]["session_id"] != e.session_id:
            spans.append({"session_id": e.session_id, "from_chunk": e.index})
    return spans


def _compact(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def png_bytes(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def image_digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).data).hexdigest()


def frames_digest(frames: np.ndarray) -> str:
    """A chunk's digest: sha256 of its frames, [T, H, W, 3] uint8 in C order (the replay computes the same)."""
    return hashlib.sha256(np.ascontiguousarray(frames).data).hexdigest()


def read_image_from(record: dict[str, Any]) -> np.ndarray:
    """The recording's start image, checked against its digest."""
    try:
        data = base64.b64decode(record["image"]["png"])
    except KeyError:
        raise ValueError("the recording holds no start image (it is kept only while its session is listed)") from None
    image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    if image_digest(image) != record["image"]["sha256"]:
        raise ValueError("the recording's start image does not match its digest")
    return image
