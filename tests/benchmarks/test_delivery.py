"""Delivery figures from what a client recorded: identity by stamp and by pts, repeats, order, stalls, g2g."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.delivery import analyze, ids_by_pts
from worldrtc.frames import ContentIds, ReceivedFrame

FPS = 16
STEP = 90_000 // FPS


def chunk(index: int, first_frame: int, n: int, pts_start: int, applied_seq: int | None = None) -> dict:
    return {
        "index": index,
        "first_frame": first_frame,
        "num_frames": n,
        "pts_start": pts_start,
        "pts_end": pts_start + (n - 1) * STEP,
        "applied_seq": applied_seq,
    }


def played(ids: list[int | None], t0: float = 10.0) -> list[ReceivedFrame]:
    """What the pacer sends at 16 FPS: frame ids in order, None where it repeats the last one."""
    out, last = [], None
    for tick, frame_id in enumerate(ids):
        last = frame_id if frame_id is not None else last
        out.append(ReceivedFrame(t0 + tick / FPS, tick * STEP, last, content_id=last if last is not None else -1))
    return out


def test_repeats_after_the_first_chunk_stalls_and_unique_fps() -> None:
    # 13 frames, 3 repeats (a late chunk), then 16 frames.
    ids = [*range(13), None, None, None, *range(13, 29)]
    frames = played(ids)
    chunks = [chunk(0, 0, 13, 0, applied_seq=1), chunk(1, 13, 16, 16 * STEP, applied_seq=2)]
    r = analyze(frames, chunks, {1: 9.9, 2: 10.5}, FPS, first_chunk_frames=13, stamped=True)
    assert (r["unique_frames"], r["repeated_frames"], r["repeated_frames_after_first_chunk"]) == (29, 3, 3)
    assert r["out_of_order_frames"] == 0 and r["stalls"] == 1 and r["stalled_s"] == pytest.approx(4 / FPS)
    assert r["client_unique_fps"] == pytest.approx(28 / (31 / FPS))
    assert r["pts_identity_agrees_with_stamps"] == 1.0  # the pts map sees the same repeats
    # seq 1 → chunk 0's first frame (t 10.0); seq 2 → chunk 1's first frame, shown at tick 16.
    assert r["glass_to_glass_s"]["count"] == 2
    assert r["glass_to_glass_s"]["max"] == pytest.approx(10.0 + 16 / FPS - 10.5)


def test_pts_identity_for_real_models() -> None:
    ids = [*range(13), None, *range(13, 29)]
    frames = [ReceivedFrame(f.t, f.pts, None, f.content_id) for f in played(ids)]
    chunks = [chunk(0, 0, 13, 0), chunk(1, 13, 16, 14 * STEP)]
    assert ids_by_pts(frames, chunks, FPS) == ids
    r = analyze(frames, chunks, {}, FPS, first_chunk_frames=13, stamped=False)
    assert (r["unique_frames"], r["repeated_frames"], r["out_of_order_frames"]) == (29, 1, 0)
    assert r["pts_identity_agrees_with_stamps"] is None


def test_out_of_order_and_unreadable_stamps_are_counted() -> None:
    frames = played([0, 1, 3, 2, 4])
    frames.append(ReceivedFrame(20.0, 5 * STEP, None, 5))  # no readable stamp
    r = analyze(frames, [], {}, FPS, first_chunk_frames=13, stamped=True)
    assert r["out_of_order_frames"] == 2 and r["unique_frames"] == 4


def test_content_ids_change_with_content_only() -> None:
    ids = ContentIds()
    a = np.zeros((64, 64), np.uint8)
    b = a.copy()
    b[::4, ::4] = 2  # mean |Δ| 2 on the sampled pixels
    assert [ids(a), ids(a), ids(b), ids(b + 0), ids(a)] == [0, 0, 1, 1, 2]
