"""Snapshots: what saving a world costs the viewer, how soon a branch shows video, and its size.

    python -m benchmarks.snapshots --out runs/snapshots.json            # gridworld on the cpu placement
    python -m benchmarks.snapshots --serve "--model tiny" --snapshots 3 --out runs/snapshots-tiny.json

One server (`--serve`, arguments of `python -m server`; default the embedded model on `--placement
cpu`) and one driver holding W. Once `--warmup-chunks` chunks have arrived, it saves `--snapshots`
snapshots, one every `--interval-s`, then starts a branch from each in turn (closing the previous
one: the server's sessions are the machine's cores).

- Stall seen by the viewer while a snapshot is taken: the session's pacer counts every tick it had
  no new frame for (`frames_repeated`, what the user sees as a freeze); the figure is the repeats
  between the first save and the last save's answer, in chunks, and the repeats of the whole run
  after its first chunk. Beside it, each save's wall time (the POST, which waits for the boundary).
- Branch → first frame: from just before the branch's create POST to its first decoded frame
  (create, offer, ICE, the engine opening the session from the snapshot, its first chunk).
- Bytes: each snapshot's measured bytes (every worker's part) against the memory plan's figure for
  the model (`python -m workers plan`).

Targets (the default model on this 2-core machine): stall ≤ 1 chunk and 0 repeated frames after the
first chunk; branch → first frame ≤ 2 s; measured bytes = planned ± 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.local_server import local_server
from workers.chunk_geometry import chunk_num_frames
from workers.models.presets import get_preset
from workers.runtime.memory_plan import machine_capacity, plan_memory
from workers.runtime.placement import get_placement
from worldrtc import Session


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", default="--model gridworld --placement cpu", help="arguments of `python -m server`")
    p.add_argument("--snapshots", type=int, default=3)
    p.add_argument("--interval-s", type=float, default=3.0)
    p.add_argument("--warmup-chunks", type=int, default=4)
    p.add_argument("--branch-s", type=float, default=4.0, help="how long each branch streams")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def _option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args else default


async def measure(url: str, model: str, placement: str, a: argparse.Namespace) -> dict[str, Any]:
    http = httpx.AsyncClient(base_url=url, timeout=60)
    driver = Session(url)
    await driver.start()
    driver.hold("w")
    while len(driver.run.chunks) < a.warmup_chunks:
        await asyncio.sleep(0.05)
    assert driver.info is not None
    sid, token = driver.info["session_id"], driver.info["token"]
    own = {"authorization": f"Bearer {token}"}

    async def metrics() -> dict[str, Any]:
        return dict((await http.get(f"/v1/sessions/{sid}", headers=own)).json()["metrics"])

    before = await metrics()
    saves = []
    for i in range(a.snapshots):
        t0 = time.perf_counter()
        info = await driver.save()
        saves.append(info | {"post_s": time.perf_counter() - t0})
        if i + 1 < a.snapshots:
            await asyncio.sleep(a.interval_s)
    after = await metrics()
    await driver.close()

    branches = []
    for info in saves:
        branch = Session(url, snapshot=info["snapshot_id"], token=token)
        t0 = time.perf_counter()
        await branch.start()
        branch.hold("w")
        while branch.run.first_frame_t is None:
            await asyncio.sleep(0.01)
        first_s = branch.run.first_frame_t - t0
        await asyncio.sleep(a.branch_s)
        record = await branch.server_info()
        await branch.close()
        branches.append({"snapshot_id": info["snapshot_id"], "first_frame_s": first_s, "metrics": record["metrics"]})
    await http.aclose()

    preset = get_preset(model)
    plan = plan_memory(preset, get_placement(placement), 1, machine_capacity())
    planned = {"before_fixed_point": plan.snapshot_bytes, "after_fixed_point": plan.snapshot_steady_bytes}

    def against_plan(nbytes: int) -> dict[str, Any]:
        """The plan's figure for the snapshot's phase: the nearer of the two (the encoder's caches
        are a large part of it until the fixed point)."""
        phase = min(planned, key=lambda k: abs(planned[k] - nbytes))
        return {"phase": phase, "ratio": nbytes / planned[phase]}

    chunk_frames = chunk_num_frames(1, preset.chunk_latent_frames)
    repeats_saving = after["frames_repeated"] - before["frames_repeated"]
    return {
        "model": model,
        "placement": placement,
        "saves": saves,
        "branches": branches,
        "stall_while_saving_chunks": repeats_saving / chunk_frames,
        "repeats_while_saving": repeats_saving,
        "repeats_after_first_chunk": after["frames_repeated"],
        "frames_sent": after["frames_sent"],
        "branch_first_frame_s": [b["first_frame_s"] for b in branches],
        "branch_repeats": [b["metrics"]["frames_repeated"] for b in branches],
        "bytes_measured": [s["bytes"] for s in saves],
        "bytes_planned": planned,
        "bytes_against_plan": [against_plan(s["bytes"]) for s in saves],
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    serve = shlex.split(a.serve)
    model, placement = _option(serve, "--model", "gridworld"), _option(serve, "--placement", "cpu")
    with tempfile.TemporaryDirectory() as tmp, local_server(serve, Path(tmp) / "server.log") as srv:
        report = asyncio.run(measure(srv.url, model, placement, a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=1))
    mib = 2**20
    print(f"snapshots of {model} on {placement}:")
    for s in report["saves"]:
        print(f"  chunk {s['chunk_index']:>3}: {s['bytes'] / mib:.1f} MiB, saved in {s['post_s']:.2f} s")
    stall, repeats = report["stall_while_saving_chunks"], report["repeats_while_saving"]
    print(f"  stall while saving: {stall:.2f} chunks ({repeats} repeated frames)")
    print(f"  repeated frames after the first chunk, whole run: {report['repeats_after_first_chunk']}")
    firsts = ", ".join(f"{s:.2f}" for s in report["branch_first_frame_s"])
    print(f"  branch -> first frame: {firsts} s; branches' repeats {report['branch_repeats']}")
    planned = ", ".join(f"{k.replace('_', ' ')} {v / mib:.1f} MiB" for k, v in report["bytes_planned"].items())
    ratios = ", ".join(f"{r['ratio']:.3f} ({r['phase'].replace('_', ' ')})" for r in report["bytes_against_plan"])
    print(f"  bytes measured / planned ({planned}): {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
