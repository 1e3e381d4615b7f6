"""A session's recording (server/media/recording.py) as a replay's input, and the replay's verdict on it.

`benchmarks.replay --recording REC.json` takes from it the model, seed, prompt, start image, chunk
size, placement and intra-op thread count, and each chunk's control as the DiT consumed it; it
refuses a recording made on other weights or another model before anything loads, and compares
every chunk's digest with the one recorded. Equal digests are promised only at the same placement
and thread count (workers/determinism.py); at another thread count the frames agree within the
stated tolerance, which digests cannot show, so the verdict says so instead of failing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.media.recording import RECORDING_SCHEMA, read_image_from
from workers.controls import ChunkControl
from workers.determinism import FRAME_TOLERANCE
from workers.models.presets import PRESETS
from workers.models.weights_digest import weights_digest
from workers.runtime.placement import PLACEMENTS, Placement


class RecordingError(ValueError):
    """The recording cannot be replayed here; the message says why."""


@dataclass(frozen=True)
class Recorded:
    path: Path
    data: dict[str, Any]
    image: np.ndarray

    @staticmethod
    def load(path: Path) -> Recorded:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise RecordingError(f"{path}: not a readable recording ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != RECORDING_SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else None
            raise RecordingError(f"{path}: expected schema {RECORDING_SCHEMA!r}, found {found!r}")
        if data["model"] not in PRESETS:
            raise RecordingError(f"{path}: recorded on model {data['model']!r}, which this build has no preset for")
        return Recorded(path, data, read_image_from(data))

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return list(self.data["chunks"])

    def placement(self) -> Placement:
        """The recorded placement: by name where this build has it with the same devices, else as recorded."""
        recorded = self.data["placement"]
        named = PLACEMENTS.get(recorded["name"])
        if named is not None and named.stage_record() == recorded["stages"]:
            return named
        threads = self.data["intra_op_threads"]
        return Placement.from_dict({"name": recorded["name"], **recorded["stages"], "cpu_threads_per_worker": threads})

    def check_weights(self, checkpoint_dir: Path | None, weights_seed: int) -> None:
        preset = PRESETS[self.data["model"]]
        here = weights_digest(preset, checkpoint_dir, weights_seed)
        if here != self.data["weights"]:
            where = "" if checkpoint_dir is None else f" in {checkpoint_dir}"
            raise RecordingError(
                f"{self.path} was recorded on other weights than these{where}: recorded {self.data['weights']}, "
                f"here {here}; pass the checkpoint (--checkpoint) or --weights-seed it was made with"
            )

    def prompt_changes(self) -> dict[int, tuple[str, int]]:
        """Chunk index -> the prompt change its DiT took (text, transition chunks)."""
        return {
            c["index"]: (c["prompt"]["text"], int(c["prompt"]["transition_chunks"]))
            for c in self.chunks
            if c.get("prompt")
        }

    def controls(self) -> Callable[[int], tuple[ChunkControl, bool]]:
        rows = self.chunks

        def control(index: int) -> tuple[ChunkControl, bool]:
            row = rows[index]
            dx, dy = row["look"]
            return ChunkControl(keys=frozenset(row["keys"]), look_dx_px=dx, look_dy_px=dy), bool(row["reset_pose"])

        return control

    def verdict(self, digests: list[str], placement: Placement) -> dict[str, Any]:
        """Every chunk's digest against the recorded one; whether equality was promised here."""
        recorded = [c["frames_sha256"] for c in self.chunks]
        equal = sum(a == b for a, b in zip(recorded, digests, strict=False))
        same_threads = placement.cpu_threads_per_worker == self.data["intra_op_threads"]
        stages = placement.stage_record()
        same_placement = stages == self.data["placement"]["stages"]
        promised = same_threads and same_placement
        if promised:
            summary = (
                f"every chunk's digest equal ({equal} of {len(recorded)})"
                if equal == len(recorded) == len(digests)
                else f"{len(recorded) - equal} of {len(recorded)} chunk digests differ from the recording"
            )
        else:
            why = (
                f"intra-op threads {placement.cpu_threads_per_worker}, recorded {self.data['intra_op_threads']}"
                if not same_threads
                else f"placement {stages}, recorded {self.data['placement']['stages']}"
            )
            summary = (
                f"{why}: equal digests are not promised; the frames agree within the stated tolerance "
                f"({FRAME_TOLERANCE}), not bit for bit ({equal} of {len(recorded)} digests equal)"
            )
        return {
            "recording": str(self.path),
            "session_id": self.data["session_id"],
            "chunks": len(recorded),
            "digests_equal": equal,
            "equality_promised": promised,
            "ok": (equal == len(recorded) == len(digests)) or not promised,
            "summary": summary,
        }
