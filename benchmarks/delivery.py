"""What a viewer got: unique generated frames, repeats, stalls, order and glass-to-glass latency.

A frame the server's pacer repeats is not a delivered frame, so frames are told apart by identity,
not counted:

- by stamp (the synthetic model, `workers/frame_stamp.py`): each frame's global index is read from the
  picture itself, so uniqueness, repeats and order are exact;
- by pts (real models): the server's `chunk` messages map each part of each chunk to a pts range
  (one 90 kHz step per frame; repeats take pts too), so a received frame whose pts lies in no range
  is a repeat. Exact unless the pacer dropped frames (its counters say
  so); on the synthetic model both identities are computed and must agree;
- by content, a cross-check only: a frame whose luma (every 4th pixel) differs from the previous one
  by less than `REPEAT_MAX_MEAN_DIFF` on average looks repeated. Generated frames of a still scene can
  look alike too, so this count is an upper bound.

Pure: it takes what the client recorded and returns figures.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.stats import summarize
from worldrtc.frames import ReceivedFrame, glass_to_glass_s

STALL_FRAMES = 2  # a gap between new frames longer than this many frame intervals is a stall
VIDEO_CLOCK_HZ = 90_000


def _pts_ranges(chunks: list[dict[str, Any]], step: int) -> list[tuple[int, int, int]]:
    """(pts_start, pts_end, first_frame) per run of consecutive pts: each part of each chunk."""
    ranges = []
    for c in chunks:
        for first_frame, pts_start, n in c.get("parts") or [[c["first_frame"], c["pts_start"], c["num_frames"]]]:
            ranges.append((pts_start, pts_start + (n - 1) * step, first_frame))
    return sorted(ranges)


def ids_by_pts(frames: list[ReceivedFrame], chunks: list[dict[str, Any]], fps: int) -> list[int | None]:
    """Each frame's index in the session's video from the chunks' pts ranges; None for a repeat."""
    step = VIDEO_CLOCK_HZ // fps
    ranges = _pts_ranges(chunks, step)
    starts = [r[0] for r in ranges]
    out: list[int | None] = []
    for f in frames:
        i = bisect.bisect_right(starts, f.pts) - 1
        inside = i >= 0 and f.pts <= ranges[i][1] and (f.pts - ranges[i][0]) % step == 0
        out.append(ranges[i][2] + (f.pts - ranges[i][0]) // step if inside else None)
    return out


@dataclass(frozen=True)
class _Walk:
    unique_t: list[float]
    repeats: int
    repeats_after_first_chunk: int
    out_of_order: int
    repeat_t: list[float]


def _walk(ids: list[int], times: list[float], first_chunk_frames: int) -> _Walk:
    """Frame ids in arrival order: new, a repeat (the previous id again) or out of order (older)."""
    unique_t: list[float] = []
    repeat_t: list[float] = []
    repeats = after_first = out_of_order = 0
    last_id: int | None = None
    max_id = -1
    for frame_id, t in zip(ids, times, strict=True):
        if frame_id == last_id:
            repeats += 1
            after_first += max_id >= first_chunk_frames - 1
            repeat_t.append(t)
        elif frame_id < max_id:
            out_of_order += 1
        else:
            unique_t.append(t)
            max_id = frame_id
        last_id = frame_id
    return _Walk(unique_t, repeats, after_first, out_of_order, repeat_t)


def _carry_forward(ids: list[int | None]) -> list[int]:
    """A repeat (None) carries the previous frame's id."""
    out: list[int] = []
    for frame_id in ids:
        out.append(frame_id if frame_id is not None else (out[-1] if out else -1))
    return out


def analyze(
    frames: list[ReceivedFrame],
    chunks: list[dict[str, Any]],
    sent: dict[int, float],
    fps: int,
    first_chunk_frames: int,
    stamped: bool,
) -> dict[str, Any]:
    """Delivery figures for one viewer. `chunks`: the server's `chunk` messages; `sent`: control seq → send time."""
    times = [f.t for f in frames]
    pts_ids = _carry_forward(ids_by_pts(frames, chunks, fps))
    # An unreadable stamp (-1) counts as out of order: the check fails loudly rather than quietly.
    ids = [-1 if f.stamp is None else f.stamp for f in frames] if stamped else pts_ids
    walk = _walk(ids, times, first_chunk_frames)
    by_content = _walk([f.content_id for f in frames], times, first_chunk_frames)
    unique_t = walk.unique_t
    gaps = [b - a for a, b in itertools.pairwise(unique_t)]
    stalls = [g for g in gaps if g > STALL_FRAMES / fps]
    span = unique_t[-1] - unique_t[0] if len(unique_t) > 1 else 0.0
    unique_fps = (len(unique_t) - 1) / span if span > 0 else None
    jitter = np.abs(np.asarray([b - a for a, b in itertools.pairwise(times)]) - 1 / fps)
    g2g = glass_to_glass_s(frames, chunks, sent, stamped)
    return {
        "identity": "frame stamps" if stamped else "pts ranges of the chunk messages",
        "frames_received": len(frames),
        "unique_frames": len(unique_t),
        "client_unique_fps": unique_fps,
        "client_unique_fps_over_target": None if unique_fps is None else unique_fps / fps,
        "repeated_frames": walk.repeats,
        "repeated_frames_after_first_chunk": walk.repeats_after_first_chunk,
        "repeated_fraction_after_first_chunk": walk.repeats_after_first_chunk
        / max(1, len(frames) - first_chunk_frames),
        "out_of_order_frames": walk.out_of_order,
        # When repeats happened, seconds after the first frame (the first 20): start-up, or a hiccup.
        "repeats_at_s": [round(t - times[0], 3) for t in walk.repeat_t[:20]],
        "stalls": len(stalls),
        "stalled_s": sum(stalls),
        "frame_interval_jitter_p99_s": float(np.percentile(jitter, 99)) if jitter.size else None,
        "glass_to_glass_s": summarize(g2g) | {"p95": float(np.percentile(g2g, 95)) if g2g else None},
        "repeated_frames_by_content": by_content.repeats,
        "pts_identity_agrees_with_stamps": sum(a == b for a, b in zip(ids, pts_ids, strict=True)) / max(1, len(ids))
        if stamped
        else None,
    }
