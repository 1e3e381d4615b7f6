"""What a client records of each received frame, frame identity by content, and glass-to-glass latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

REPEAT_MAX_MEAN_DIFF = 1.0  # mean |Δluma| (0–255) under which a frame looks like the previous one again


@dataclass(frozen=True)
class ReceivedFrame:
    t: float  # receive time, client clock (s)
    pts: int  # 90 kHz
    stamp: int | None  # the stamped frame index (synthetic model; None: none readable)
    content_id: int  # content changes seen so far (see ContentIds)


class ContentIds:
    """Frame ids by content: a new id whenever the luma differs from the previous frame's."""

    def __init__(self) -> None:
        self._previous: np.ndarray | None = None
        self._id = -1

    def __call__(self, luma: np.ndarray) -> int:
        small = luma[::4, ::4].astype(np.int16)
        if self._previous is None or np.abs(small - self._previous).mean() >= REPEAT_MAX_MEAN_DIFF:
            self._id += 1
        self._previous = small
        return self._id


def _first_shown(frames: list[ReceivedFrame], chunk: dict[str, Any], sent_t: float, stamped: bool) -> float | None:
    """When the first frame of `chunk` arrived after `sent_t`: found by its stamp on the synthetic
    model, by its pts on real ones."""
    if stamped:
        hits = (f.t for f in frames if f.stamp is not None and f.stamp >= chunk["first_frame"] and f.t >= sent_t)
    else:
        hits = (f.t for f in frames if f.pts >= chunk["pts_start"] and f.t >= sent_t)
    return next(hits, None)


def glass_to_glass_s(
    frames: list[ReceivedFrame], chunks: list[dict[str, Any]], sent: dict[int, float], stamped: bool
) -> list[float]:
    """Per control: send → first received frame of the first chunk that applied it (seq echoed)."""
    out = []
    ordered = sorted((c for c in chunks if c.get("applied_seq") is not None), key=lambda c: c["index"])
    for seq, sent_t in sent.items():
        chunk = next((c for c in ordered if c["applied_seq"] >= seq), None)
        shown = None if chunk is None else _first_shown(frames, chunk, sent_t, stamped)
        if shown is not None:
            out.append(shown - sent_t)
    return out


def prompt_to_frame_s(
    frames: list[ReceivedFrame], chunks: list[dict[str, Any]], prompts: list[tuple[str, float]], stamped: bool
) -> list[float]:
    """Per prompt: send → first received frame of the first chunk whose DiT read it (its receipt
    names the text; a chunk whose message came before the send does not count)."""
    out = []
    ordered = sorted((c for c in chunks if c.get("prompt")), key=lambda c: c["index"])
    for text, sent_t in prompts:
        chunk = next(
            (c for c in ordered if c["prompt"]["text"] == text and c.get("received_t", sent_t) >= sent_t), None
        )
        shown = None if chunk is None else _first_shown(frames, chunk, sent_t, stamped)
        if shown is not None:
            out.append(shown - sent_t)
    return out
