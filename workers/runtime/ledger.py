"""Slot bookkeeping: which producer slots a session still holds, and which acks to forward.

A slot is named by a `SlotRef`; one use of it by its `SlotKey` (a reused slot gets a new
generation, so keys never repeat). Inline tensors hold no slot and have no key.
"""

from __future__ import annotations

from typing import NamedTuple

from workers.runtime.channel import Ack, SlotRef
from workers.runtime.messages import TensorRef


class SlotKey(NamedTuple):
    producer: str
    channel_id: str
    profile_id: int
    slot: int
    generation: int


def slot_key(ref: TensorRef | None) -> SlotKey | None:
    """Identity of one use of a slot (None for inline tensors, which hold no slot)."""
    if isinstance(ref, SlotRef):
        return SlotKey(ref.producer, ref.channel_id, ref.profile_id, ref.slot, ref.generation)
    return None


class SlotLedger:
    """The slots one session holds: tracked when a stage publishes into them, untracked when the
    scheduler acks them back. What is left when the session ends has leaked."""

    def __init__(self) -> None:
        self._held: dict[SlotKey, SlotRef] = {}

    def track(self, ref: TensorRef | None) -> None:
        key = slot_key(ref)
        if key is not None:
            assert isinstance(ref, SlotRef)
            self._held[key] = ref

    def untrack(self, ref: TensorRef | None) -> None:
        key = slot_key(ref)
        if key is not None:
            self._held.pop(key, None)

    def __len__(self) -> int:
        return len(self._held)


def acks_to_forward(acks: list[Ack]) -> list[Ack]:
    """The acks a producer should get once every consuming rank has replied: a sharded slot is acked
    per shard rank (the producer frees it after all), a slot read whole by several ranks exactly once
    (the producer rejects duplicates); inline tensors need none."""
    forward: list[Ack] = []
    seen: set[SlotKey] = set()
    for ack in acks:
        key = slot_key(ack.ref)
        if key is None or ack.ref is None:
            continue
        if ack.ref.num_shards > 1 or key not in seen:
            forward.append(ack)
        seen.add(key)
    return forward
