"""What a new session starts from once its create is checked: the request, the decoded start image
(or the snapshot of a branch) and who asked. A create that finds a free slot opens its session from
it at once; one that waits keeps it on its ticket (server/waiting_room/line.py) until a slot is its."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.snapshots.snapshot import ServerSnapshot
from server.wire.protocol import CreateSessionRequest


@dataclass(frozen=True)
class Admission:
    body: CreateSessionRequest
    client: str  # the address that asked (the per-client limits count it)
    scene: str | None
    image: np.ndarray  # HxWx3 uint8 at the model's resolution: about 1.2 MB at 832×480
    branch_of: ServerSnapshot | None = None

    def continuing(self, snapshot: ServerSnapshot) -> Admission:
        """The same person, taking over the world saved in `snapshot` (a turn's hand-over)."""
        return Admission(self.body, self.client, snapshot.origin.scene, snapshot.origin.image, snapshot)
