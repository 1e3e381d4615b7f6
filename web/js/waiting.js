// The waiting room: a create that finds every slot taken gets a ticket (202; server/http/routes/tickets.py).
// The page polls it, says where the person stands and about how long, shows the world they may watch
// meanwhile under the overlay (a receive-only watch with the ticket's watch token), and hands back
// the session's create answer once it is the ticket's turn. A session stopped while in line leaves
// it (DELETE), so the place passes on at once rather than after the server stops hearing from it.

import { ApiError, api, responseError, unreachable } from "./api.js";
import { el } from "./dom.js";
import { alive, getIceServers, waitIceGathering } from "./peer.js";
import { app, hook } from "./state.js";
import { setState } from "./status.js";

const POLL_MS = 1500; // within the server's 2 polls a second; a ticket unpolled for 30 s is dropped
const HEAD_POLL_MS = 500; // the head of the line: its seat may come any moment
const ICE_GATHER_TIMEOUT_MS = 5000;

// `s`: the session (session.js) that waits; `ticket`: the 202's body. Resolves to the ticket's ready
// answer ({session: the create answer, connect_by_s}), or null once `s` is no longer the page's
// (stopped, replaced): the ticket is left.
export async function waitInLine(s, ticket) {
  const token = ticket.ticket_token;
  let preview = null;
  let tried = null; // the watch URL last opened: one that failed is not tried again every poll
  const pollUrl = ticket.poll_url;
  const leaveOnHide = () => leave(pollUrl, token); // a closed tab gives its place up at once
  window.addEventListener("pagehide", leaveOnHide);
  try {
    for (;;) {
      if (ticket.state !== "waiting") {
        hook.queue = null;
        return ticket;
      }
      hook.queue = { position: ticket.position, waiting: ticket.waiting, estimatedWaitS: ticket.estimated_wait_s };
      setState("waiting", describe(ticket, preview));
      if (ticket.watch_url && ticket.watch_url !== tried) {
        closePreview(preview);
        tried = ticket.watch_url;
        preview = await openPreview(s, new URL(ticket.watch_url, window.location.href).href, ticket.watch_token);
        setState("waiting", describe(ticket, preview));
      }
      await new Promise((resolve) => setTimeout(resolve, ticket.position === 1 ? HEAD_POLL_MS : POLL_MS));
      if (!alive(s)) {
        leave(pollUrl, token);
        return null;
      }
      try {
        ticket = { ...(await api("GET", ticket.poll_url, undefined, token)), poll_url: ticket.poll_url };
      } catch (err) {
        // Polled too fast (another tab of the same ticket): the next round comes back later.
        if (!(err instanceof ApiError && err.status === 429 && err.code === "rate_limited")) throw err;
      }
    }
  } finally {
    window.removeEventListener("pagehide", leaveOnHide);
    closePreview(preview);
    if (app.current === s) hook.watchingWhileWaiting = false;
  }
}

function describe(ticket, preview) {
  const place = ticket.position === 1 ? "You are next" : `You are number ${ticket.position} in line`;
  const wait = ticket.estimated_wait_s > 0 ? ` (about ${formatWait(ticket.estimated_wait_s)})` : "";
  const watching = preview ? ". Meanwhile, the world as someone walks it:" : ".";
  return `Every seat is taken. ${place}${wait}${watching}`;
}

function formatWait(s) {
  return s < 90 ? `${Math.max(1, Math.round(s))} s` : `${Math.round(s / 60)} min`;
}

// Best effort (an unpolled ticket is dropped anyway); keepalive lets it finish while the page unloads.
function leave(pollUrl, token) {
  fetch(pollUrl, { method: "DELETE", headers: { Authorization: `Bearer ${token}` }, keepalive: true }).catch(() => {});
}

// A receive-only watch of the world under the overlay: the video only, no messages read.
async function openPreview(s, url, watchToken) {
  const preview = { url, token: watchToken, pc: null, resource: null };
  try {
    const pc = new RTCPeerConnection({ iceServers: await getIceServers() });
    preview.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.createDataChannel("watch", { ordered: true });
    pc.ontrack = (ev) => {
      if (app.current !== s || !preview.pc) return;
      el.video.srcObject = ev.streams && ev.streams[0] ? ev.streams[0] : new MediaStream([ev.track]);
      const p = el.video.play();
      if (p && p.catch) p.catch(() => {});
      hook.watchingWhileWaiting = true;
    };
    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc, ICE_GATHER_TIMEOUT_MS);
    let resp;
    try {
      resp = await fetch(url, {
        method: "POST",
        headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${watchToken}` },
        body: pc.localDescription.sdp,
      });
    } catch (_) {
      throw unreachable();
    }
    const text = await resp.text();
    if (!resp.ok) throw responseError(resp, text);
    const location = resp.headers.get("Location");
    if (location) preview.resource = new URL(location, url).href;
    await pc.setRemoteDescription({ type: "answer", sdp: text });
    return preview;
  } catch (_) {
    closePreview(preview); // no preview (the world ended, too many watching): waiting goes on without it
    return null;
  }
}

function closePreview(preview) {
  if (!preview) return;
  if (preview.pc) preview.pc.close();
  preview.pc = null;
  if (preview.resource) {
    fetch(preview.resource, { method: "DELETE", headers: { Authorization: `Bearer ${preview.token}` } }).catch(() => {});
  }
}
