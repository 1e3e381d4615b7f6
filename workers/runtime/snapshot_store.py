"""A worker's parts of snapshots: its stage's share of each session state the engine saved.

Parts live in host memory or, once spilled, in files under the spill directory
(`<dir>/<snapshot>/<stage><rank>.{pickle,safetensors}`). What to keep, spill or drop is the
engine's decision (workers/runtime/snapshot_catalog.py, which counts every worker's bytes against
the budget); this store only carries it out, in the order the commands arrive.

On a GPU the capture is a copy on the stage's device (fast, in the chunk loop's stream order); the
copy to host memory then runs on a side stream from a thread, so the next chunk's kernels need not
wait for it. The device copy is freed when the host copy is done. On a CPU the capture already is
the host copy.

A save (`keep`) is written off the command loop, so that chunks go on while GiBs go to disk: one
writer thread per worker writes one part at a time (later saves wait their turn in its queue, which
the snapshot budget bounds, as it bounds the parts held) and calls back when the files are complete.
The part's memory is freed once it is written: from then on its files are the part (`get` reads
them), and a drop forgets it without touching them (they are the save's). A part dropped while it is
being written has its new files removed and the save fails.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.session_state import StatePart

log = logging.getLogger(__name__)


class SnapshotPartMissing(KeyError):
    pass


@dataclass
class _Held:
    part: StatePart | None = None  # None while the part is on disk only
    path: Path | None = None  # the files' stem: spilled, or saved
    saved: bool = False  # `path` is a save's: dropping the part leaves the files
    done: threading.Event = field(default_factory=threading.Event)  # set once the part is in host memory


WriteDone = Callable[[str | None], None]  # None once the files are complete, or why not


@dataclass(frozen=True)
class _Write:
    snapshot_id: str
    directory: Path
    on_done: WriteDone


class SnapshotStore:
    def __init__(self, name: str) -> None:
        self.name = name  # "dit0": this worker's files in a spilled snapshot's directory
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()  # `_held`, between the command loop and the writer
        self._writes: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()  # None: stop
        self._writer: threading.Thread | None = None

    def put(self, snapshot_id: str, part: StatePart) -> None:
        held = _Held(part)
        with self._lock:
            self._held[snapshot_id] = held
        if all(t.device.type == "cpu" for t in part.tensors):
            held.done.set()
            return
        device = next(t.device for t in part.tensors if t.device.type != "cpu")
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record(torch.cuda.current_stream(device))

        def copy() -> None:
            side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            with torch.cuda.stream(side):
                side.wait_event(ready)
                assert held.part is not None
                held.part = held.part.to_host()  # the device copy goes with the last reference to it
            held.done.set()  # readers wait for this before touching `part`

        threading.Thread(target=copy, name=f"snapshot-{snapshot_id}", daemon=True).start()

    def get(self, snapshot_id: str) -> StatePart:
        held = self._find(snapshot_id)
        held.done.wait()
        with self._lock:
            part, path = held.part, held.path
        if part is not None:
            return part
        assert path is not None
        return StatePart.load(path)

    def spill(self, snapshot_id: str, directory: Path) -> None:
        with self._lock:
            held = self._held.get(snapshot_id)
        if held is None:
            return
        held.done.wait()
        with self._lock:
            part = None if held.saved else held.part
        if part is None:  # on disk already: spilled, or saved by the writer
            return
        path = directory / snapshot_id / self.name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part.save(path)
        except OSError as exc:
            # The memory must go either way (the budget said so): the snapshot is lost, and a
            # restore of it will say so.
            log.warning("%s: could not spill snapshot %s (%s); dropping it", self.name, snapshot_id, exc)
            self.drop(snapshot_id)
            return
        with self._lock:
            if self._held.get(snapshot_id) is held and not held.saved:
                held.path, held.part = path, None
                return
        _unlink(path)  # dropped, or saved by the writer, meanwhile: these files are nobody's

    def keep(self, snapshot_id: str, directory: Path, on_done: WriteDone) -> None:
        """Write the part to `directory`/<snapshot_id>/<name> on the writer thread, then free its
        memory; `on_done` (on that thread) gets None once the files are complete, or why not.
        Raises SnapshotPartMissing at once for a part this worker does not hold."""
        self._find(snapshot_id)
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name=f"{self.name}-writer", daemon=True)
            self._writer.start()
        self._writes.put(_Write(snapshot_id, directory, on_done))

    def _write_loop(self) -> None:
        while (write := self._writes.get()) is not None:
            error = None
            try:
                self._write(write.snapshot_id, write.directory)
            except (SnapshotPartMissing, OSError) as exc:
                error = str(exc)
            except Exception as exc:  # the save fails, not the writer: later saves still get written
                log.exception("%s: writing snapshot %s failed", self.name, write.snapshot_id)
                error = f"{type(exc).__name__}: {exc}"
            write.on_done(error)

    def _write(self, snapshot_id: str, directory: Path) -> None:
        held = self._find(snapshot_id)
        held.done.wait()
        with self._lock:
            part, spilled = held.part, held.path
        path = directory / snapshot_id / self.name
        path.parent.mkdir(parents=True, exist_ok=True)
        (part or StatePart.load(spilled)).save(path)  # type: ignore[arg-type]
        del part
        with self._lock:
            dropped = self._held.get(snapshot_id) is not held
            if not dropped:  # written: its files are the part from now on, its memory is freed
                spilled, held.path, held.part, held.saved = held.path, path, None, True
        if dropped:
            _unlink(path)
            raise SnapshotPartMissing(f"{self.name}: snapshot {snapshot_id} was dropped while it was written")
        if spilled is not None:
            _unlink(spilled)

    def load_kept(self, snapshot_id: str, directory: Path) -> StatePart:
        """This worker's part of a snapshot saved under `directory` (by this server or an earlier run)."""
        return StatePart.load(directory / snapshot_id / self.name)

    def drop(self, snapshot_id: str) -> None:
        with self._lock:
            held = self._held.pop(snapshot_id, None)
        if held is None:
            return
        held.done.wait()
        with self._lock:
            path = None if held.saved else held.path
        if path is not None:
            _unlink(path)

    def close(self) -> None:
        """Finish the writes already asked for, then drop every part."""
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join()
            self._writer = None
        for snapshot_id in list(self._held):
            self.drop(snapshot_id)

    def _find(self, snapshot_id: str) -> _Held:
        with self._lock:
            held = self._held.get(snapshot_id)
        if held is None:
            raise SnapshotPartMissing(f"{self.name} holds no part of snapshot {snapshot_id}")
        return held


def _unlink(path: Path) -> None:
    """A part's two files, and their snapshot's directory once the last worker's files are gone."""
    for suffix in (".pickle", ".safetensors"):
        path.with_suffix(suffix).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()
