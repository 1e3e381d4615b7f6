"""A WebRTC viewer that knows nothing of this project: stock aiortc and httpx, no patches, no imports
from the repository. Run as its own process by the client tests:

    python tests/support/stock_client.py URL rest|whep FRAMES [--hang] [--relay]

`rest`: POST /v1/sessions {} and POST the offer (with a `control` channel, sending nothing on it);
`whep`: POST the offer to /v1/whep (no data channel: it only watches). It receives FRAMES video
frames, prints one JSON line with what it saw, then ends the session (DELETE) — or, with `--hang`,
prints and waits to be killed, the way a crashed viewer disappears. With `--relay` (rest only) it
uses the ICE servers of the create response, relay candidates only (iceTransportPolicy "relay"),
so every packet goes through the TURN server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys

import httpx
from aiortc import RTCConfiguration, RTCIceServer, RTCIceTransportPolicy, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError


async def main(url: str, mode: str, frames: int, hang: bool, relay: bool) -> None:
    http = httpx.AsyncClient(base_url=url, timeout=30)
    session: dict[str, object] = {}
    config = RTCConfiguration()
    if mode == "rest":
        r = await http.post("/v1/sessions", json={})
        session = r.json() | {"status": r.status_code}
    if relay:
        servers = [RTCIceServer(**s) for s in session["ice_servers"]]  # type: ignore[attr-defined]
        config = RTCConfiguration(iceServers=servers, iceTransportPolicy=RTCIceTransportPolicy.RELAY)
    pc = RTCPeerConnection(config)
    pc.addTransceiver("video", direction="recvonly")
    if mode == "rest":
        pc.createDataChannel("control")
    got: list[int] = []
    enough = asyncio.Event()

    pulls: list[asyncio.Task[None]] = []

    @pc.on("track")
    def on_track(track) -> None:  # type: ignore[no-untyped-def]
        async def pull() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return  # the session ended
                got.append(int(frame.pts))
                if len(got) >= frames:
                    enough.set()

        pulls.append(asyncio.ensure_future(pull()))

    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp
    out: dict[str, object] = {"offer_candidates": [ln for ln in offer.splitlines() if ln.startswith("a=candidate")]}
    try:
        if mode == "rest":
            out["created"] = {"status": session["status"], "scene": session.get("scene")}
            token = {"authorization": f"Bearer {session['token']}"}
            # The create response says where the session lives (the node that holds it, behind a balancer).
            r = await http.post(str(session["offer_url"]), json={"sdp": offer, "type": "offer"})
            answer = r.json()["sdp"]
            resource = str(session["session_url"])
            out["session_url"] = resource
            out["session_id"] = session["session_id"]
        else:
            r = await http.post("/v1/whep", content=offer, headers={"content-type": "application/sdp"})
            out["created"] = {"status": r.status_code, "content_type": r.headers.get("content-type")}
            answer, resource, token = r.text, r.headers["location"], {}
            out["location"] = resource
            out["session_id"] = resource.rsplit("/", 1)[-1]
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        await asyncio.wait_for(enough.wait(), 120)
        out["frames"] = len(got)
        out["pts_increasing"] = all(b > a for a, b in itertools.pairwise(got))
        if hang:
            print(json.dumps(out), flush=True)
            await asyncio.Event().wait()  # until killed
        if mode == "whep":
            out["patch_status"] = (await http.patch(resource, content=b"a=candidate:x")).status_code
        out["delete_status"] = (await http.delete(resource, headers=token)).status_code
    finally:
        await http.aclose()
    await pc.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), "--hang" in sys.argv, "--relay" in sys.argv))
