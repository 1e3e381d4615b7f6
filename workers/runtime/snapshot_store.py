"""A worker's parts of snapshots: its stage's share of each session state the engine saved.

Parts live in host memory or, once spilled, in files under the spill directory
(`<dir>/<snapshot>/<stage><rank>.{pickle,safetensors}`). What to keep, spill or drop is the
engine's decision (workers/runtime/snapshot_catalog.py, which counts every worker's bytes against
the budget); this store only carries it out, in the order the commands arrive.

On a GPU the capture is a copy on the stage's device (fast, in the chunk loop's stream order); the
copy to host memory then runs on a side stream from a thread, so the next chunk's kernels need not
wait for it. The device copy is freed when the host copy is done. On a CPU the capture already is
the host copy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.session_state import StatePart

log = logging.getLogger(__name__)


class SnapshotPartMissing(KeyError):
    pass


@dataclass
class _Held:
    part: StatePart | None = None  # None while a spilled part is on disk only
    path: Path | None = None  # the spilled files' stem
    done: threading.Event = field(default_factory=threading.Event)  # set once the part is in host memory


class SnapshotStore:
    def __init__(self, name: str) -> None:
        self.name = name  # "dit0": this worker's files in a spilled snapshot's directory
        self._held: dict[str, _Held] = {}

    def put(self, snapshot_id: str, part: StatePart) -> None:
        held = _Held(part)
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
        held = self._held.get(snapshot_id)
        if held is None:
            raise SnapshotPartMissing(f"{self.name} holds no part of snapshot {snapshot_id}")
        held.done.wait()
        if held.part is not None:
            return held.part
        assert held.path is not None
        return StatePart.load(held.path)

    def spill(self, snapshot_id: str, directory: Path) -> None:
        held = self._held.get(snapshot_id)
        if held is None or held.part is None:
            return
        held.done.wait()
        path = directory / snapshot_id / self.name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            held.part.save(path)
        except OSError as exc:
            # The memory must go either way (the budget said so): the snapshot is lost, and a
            # restore of it will say so.
            log.warning("%s: could not spill snapshot %s (%s); dropping it", self.name, snapshot_id, exc)
            self.drop(snapshot_id)
            return
        held.path, held.part = path, None

    def keep(self, snapshot_id: str, directory: Path) -> None:
        """Write the part to `directory`/<snapshot_id>/<name> and free it: a saved snapshot's parts
        are its files from now on (`load_kept`). Raises SnapshotPartMissing or OSError."""
        held = self._held.get(snapshot_id)
        if held is None:
            raise SnapshotPartMissing(f"{self.name} holds no part of snapshot {snapshot_id}")
        held.done.wait()
        path = directory / snapshot_id / self.name
        path.parent.mkdir(parents=True, exist_ok=True)
        (held.part or StatePart.load(held.path)).save(path)  # type: ignore[arg-type]
        self.drop(snapshot_id)

    def load_kept(self, snapshot_id: str, directory: Path) -> StatePart:
        """This worker's part of a snapshot saved under `directory` (by this server or an earlier run)."""
        return StatePart.load(directory / snapshot_id / self.name)

    def drop(self, snapshot_id: str) -> None:
        held = self._held.pop(snapshot_id, None)
        if held is None:
            return
        held.done.wait()
        if held.path is not None:
            for suffix in (".pickle", ".safetensors"):
                held.path.with_suffix(suffix).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the last worker to leave the snapshot's directory removes it
                held.path.parent.rmdir()

    def close(self) -> None:
        for snapshot_id in list(self._held):
            self.drop(snapshot_id)
