"""Where sessions' videos live: one directory with a disk quota, oldest finished video removed first.

The directory is `recordings_dir` (WORLDRTC_RECORDINGS_DIR), or a fresh temporary one that goes with
the server. A video lives as long as its session is listed (the session's `remove`), or until newer
ones need its room. A video still being written is never removed to make room: when the ones being
written alone exceed the quota, the one that asked stops growing (its recording says so).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path


class RecordingStore:
    def __init__(self, directory: str | Path | None, quota_bytes: int) -> None:
        self._own = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="worldrtc-recordings-")) if directory is None else Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.quota_bytes = quota_bytes
        self._lock = threading.Lock()  # recorder threads of several sessions ask at once
        self._writing: set[str] = set()

    def start_video(self, session_id: str) -> Path:
        """Where the session's video goes; being written, it is never removed to make room."""
        with self._lock:
            self._writing.add(session_id)
        return self.directory / f"{session_id}.mp4"

    def has_room(self, session_id: str) -> bool:
        """Whether the directory is within its quota, after removing the oldest finished videos."""
        with self._lock:
            files = sorted(self.directory.glob("*.mp4"), key=lambda p: p.stat().st_mtime)
            total = sum(p.stat().st_size for p in files)
            for old in files:
                if total <= self.quota_bytes:
                    break
                if old.stem not in self._writing:
                    total -= old.stat().st_size
                    old.unlink(missing_ok=True)
            return total <= self.quota_bytes

    def finished(self, session_id: str) -> None:
        with self._lock:
            self._writing.discard(session_id)

    def remove(self, session_id: str) -> None:
        """The session is no longer listed: its video goes."""
        with self._lock:
            self._writing.discard(session_id)
            (self.directory / f"{session_id}.mp4").unlink(missing_ok=True)

    def close(self) -> None:
        """At shutdown: a temporary directory goes with its videos; a configured one keeps them."""
        if self._own:
            shutil.rmtree(self.directory, ignore_errors=True)
