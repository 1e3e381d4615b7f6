"""Row 23: recordings when their directory is full.

23 recording directory full   a tiny quota, an older video in the directory, a session past the quota
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from benchmarks.reliability.harness import CaseResult, Lab, ServerConfig, at_most, case, equal, holds
from worldrtc import Session

QUOTA_MIB = 0.25
QUOTA_BYTES = int(QUOTA_MIB * 2**20)
OLDER_BYTES = 100_000


@case(
    23,
    "recording directory full",
    f"a {QUOTA_MIB} MiB video quota, an older finished video in the directory, a session that outgrows it",
    "the older video goes first; then the session's video stops, its recording saying why; the stream "
    "goes on and the recording keeps every chunk's digest; the directory stays within the quota + 2 s "
    "of video (what the encoder holds)",
)
def recording_full(lab: Lab, r: CaseResult) -> None:
    directory = lab.log_dir / "recordings-23"
    directory.mkdir(parents=True, exist_ok=True)
    older = directory / "older.mp4"
    older.write_bytes(b"\0" * OLDER_BYTES)
    os.utime(older, (1, 1))
    # The tiny model's random-weight frames compress poorly: the quota fills within seconds.
    config = ServerConfig(("--model", "tiny", "--placement", "cpu")).with_env(
        recordings_dir=directory, recordings_quota_mib=QUOTA_MIB
    )
    with lab.own_server(config) as server:

        async def run() -> dict[str, Any]:
            s = await Session(server.url, prompt="a walk").start()
            assert s.info is not None
            sid = s.info["session_id"]
            t0 = time.monotonic()
            stopped_at: int | None = None
            while time.monotonic() - t0 < lab.pick(40, 60):
                s.press("w")
                await asyncio.sleep(0.5)
                rec = server.http.get(f"/v1/sessions/{sid}/recording").json()
                if stopped_at is None and not rec["video"]["complete"]:
                    stopped_at = len(s.run.chunks)
                if stopped_at is not None and len(s.run.chunks) >= stopped_at + 3:
                    break
            await s.close()
            rec = server.http.get(f"/v1/sessions/{sid}/recording").json()
            sizes = {p.name: p.stat().st_size for p in directory.glob("*.mp4")}
            return {"stopped_at_chunk": stopped_at, "chunks": len(s.run.chunks), "record": rec, "sizes": sizes}

        got = asyncio.run(run())
    rec, sizes = got["record"], got["sizes"]
    # The encoder holds up to a keyframe interval (1 s: a fragment is written when the next begins) and
    # its lookahead before bytes reach the file: the quota is kept to within 2 s of video.
    per_frame = rec["video"]["bytes"] / max(1, rec["video"]["frames"])
    slack = int(2 * 16 * per_frame)
    r.figures = {
        "stopped_at_chunk": got["stopped_at_chunk"],
        "chunks_received": got["chunks"],
        "video": rec["video"],
        "recording_complete": rec["complete"],
        "directory_bytes": sum(sizes.values()),
    }
    r.checks = [
        holds("the older finished video was removed first", "older.mp4" not in sizes, sorted(sizes)),
        holds("the session's video stopped", got["stopped_at_chunk"] is not None, got["stopped_at_chunk"]),
        holds("its recording says why", "full" in (rec["video"]["reason"] or ""), rec["video"]["reason"]),
        holds(
            "the stream went on: chunks after the stop",
            got["stopped_at_chunk"] is not None and got["chunks"] >= got["stopped_at_chunk"] + 3,
            got["chunks"],
        ),
        equal("the recording keeps every chunk's digest", rec["complete"], True),
        at_most(
            "the directory's bytes (quota + 2 s of video)", sum(sizes.values()), int(QUOTA_MIB * 2**20) + slack, " B"
        ),
    ]
