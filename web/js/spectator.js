// A spectator's watch of someone else's session, opened by a spectator link (link.js): a receive-only
// connection to the session's watch endpoint (WHEP with the watch token, server/http/routes/watch.py), the
// session's messages on a "watch" data channel, and the watch's end, said in words. A spectator
// sends nothing but pings (for the HUD's round-trip time): it cannot steer, and the server would
// answer anything else with a read_only error. Leave, or closing the page, DELETEs the watch.
// Everything that ends a watch goes through release(), so it is released once.
// Wire formats: server/wire/protocol.py; the server's side of a spectator: server/peers/spectator.py.

import { ApiError, describeApiError, responseError, sentence, transient, unreachable } from "./api.js";
import { el } from "./dom.js";
import { onChunk, startFrameWatch } from "./latency.js";
import {
  alive, armFirstFrameTimer, getIceServers, newConnection, onMessages, releasePeer, resetStats, showVideo,
  waitIceGathering, watchConnection,
} from "./peer.js";
import { app, hook } from "./state.js";
import { setState, showModel } from "./status.js";

const PING_INTERVAL_MS = 1000;
const ICE_GATHER_TIMEOUT_MS = 5000; // no trickle ICE: the offer waits for gathering, but not forever
const CONNECT_TIMEOUT_MS = 20000; // answer applied → first frame or channel open (the server's ICE limit is 15 s)
const FIRST_FRAME_TIMEOUT_MS = 90000; // channel open → first frame: the world's first chunk may still be coming
const LEAVE_WAIT_MS = 2000; // Leave waits this long for its DELETE, so the server ends the watch by it

// Why a watch ended (the code of the server's `done`, EndReason in server/wire/protocol.py) in words, and
// whether watching again with the same link could help.
const ENDINGS = {
  driver_left: ["The driver left; the world has ended.", false],
  revoked: ["The driver stopped sharing.", false],
  server_shutdown: ["The server shut down; the world has ended.", false],
  deleted: ["This watch was ended from elsewhere.", true],
  connection_closed: ["The connection to the server closed.", true],
  peer_gone: ["The server stopped hearing from this page; the network may have dropped.", true],
  ice_timeout: ["The connection could not be set up in time: the network may block WebRTC (UDP).", true],
  bad_offer: ["The server could not use this browser's offer.", false],
};
const FAILURES = new Set(["peer_gone", "ice_timeout", "bad_offer"]); // the rest end as they should

export async function watch(link) {
  if (app.current) leaveNow();
  const s = { ...newConnection(performance.now()), link, resource: null, leaving: false, deleted: false };
  app.current = s;
  hook.ended = null;
  hook.errorCode = null;
  resetStats();
  el.leaveBtn.disabled = false;
  setState("connecting", "Joining the session as a spectator\u2026");
  showStatus("Joining\u2026");
  try {
    const iceServers = await getIceServers();
    if (!alive(s)) return;
    const pc = new RTCPeerConnection({ iceServers });
    s.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    s.dc = pc.createDataChannel("watch", { ordered: true });
    showVideo(s, pc);
    watchConnection(s, pc, lost);
    wireChannel(s, s.dc);

    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc, ICE_GATHER_TIMEOUT_MS);
    if (!alive(s)) return;
    const answer = await postOffer(s, pc.localDescription.sdp);
    if (!alive(s)) {
      deleteWatch(s); // left while the offer was in flight
      return;
    }
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    armFirstFrameTimer(s, CONNECT_TIMEOUT_MS, () => fail(s, "No connection within 20 s. The network may block " +
      "WebRTC (UDP), or the server may need a TURN server.", true));
    startFrameWatch(s, () => {
      setState("streaming", "");
      showCount(s);
    });
  } catch (err) {
    if (!alive(s)) return;
    // A refusal says why in the server's words: a wrong or revoked link, an ended session, too many.
    hook.errorCode = err instanceof ApiError ? err.code : null;
    fail(s, describeApiError(err, "Cannot watch this session"), transient(err));
  }
}

// The WHEP offer: the SDP in, the answer back, and the watch's own resource (Location) to DELETE.
async function postOffer(s, sdp) {
  let resp;
  try {
    resp = await fetch(s.link.url, {
      method: "POST",
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${s.link.token}` },
      body: sdp,
    });
  } catch (_) {
    throw unreachable();
  }
  const text = await resp.text();
  if (!resp.ok) throw responseError(resp, text);
  const location = resp.headers.get("Location");
  if (location) s.resource = new URL(location, s.link.url).href;
  return text;
}

function wireChannel(s, ch) {
  onMessages(s, ch, onServerMessage);
  ch.onopen = () => {
    if (!alive(s)) return;
    armFirstFrameTimer(s, FIRST_FRAME_TIMEOUT_MS, () => fail(s, "Connected, but no video came within 90 s.", true));
    s.timers.ping = setInterval(() => ping(s), PING_INTERVAL_MS);
  };
  ch.onclose = () => lost(s, "The connection to the server closed.");
}

function ping(s) {
  if (!s.dc || s.dc.readyState !== "open") return;
  try {
    s.dc.send(JSON.stringify({ type: "ping", seq: ++s.seq, t: performance.now() }));
  } catch (_) { /* closing: the channel's close says what happened */ }
}

function onServerMessage(s, msg) {
  switch (msg.type) {
    case "ready":
      // What the page knows of the model comes with ready: GET /v1/model may want the API token,
      // which a spectator link does not carry.
      app.modelInfo = { ...app.modelInfo, model: msg.model, weights: msg.weights, width: msg.width,
        height: msg.height, fps: msg.fps };
      showModel(msg.model, msg.weights);
      break;
    case "chunk":
      onChunk(s, msg); // the chunk timings and the driver's keys, for the HUD
      break;
    case "stats":
      hook.stats.serverStats = msg;
      showCount(s);
      break;
    case "pong":
      if (typeof msg.t === "number") hook.stats.rttMs = performance.now() - msg.t;
      break;
    case "error":
      hook.error = `Server: ${sentence(msg.message || "error")}`;
      hook.errorCode = msg.code || null;
      el.hudError.textContent = hook.error;
      break;
    case "done":
      ended(s, msg.code, msg.reason);
      break;
    default:
      break;
  }
}

// The server ended the watch (done): why, in words; "Watch again" where it could help.
function ended(s, code, reason) {
  if (!alive(s) || s.leaving) return;
  hook.ended = { code: code || null, reason: reason || null };
  release(s);
  const [text, again] = ENDINGS[code] || [`The watch ended: ${sentence(reason || "closed by the server")}`, true];
  if (FAILURES.has(code)) hook.error = text;
  setState(FAILURES.has(code) ? "error" : "closed", text, again ? "watch" : null);
  showStatus(text);
}

function lost(s, text) {
  if (!alive(s) || s.leaving) return;
  fail(s, text, true);
}

function fail(s, text, again) {
  if (!alive(s)) return;
  release(s);
  deleteWatch(s); // the server may still hold it
  hook.error = text;
  setState("error", text, again ? "watch" : null);
  showStatus(text);
}

function release(s) {
  releasePeer(s);
  el.leaveBtn.disabled = true;
}

// Resolves when the server answered, or after waitMs; the request itself outlives the page (keepalive).
function deleteWatch(s, waitMs = 0) {
  if (!s.resource || s.deleted) return Promise.resolve();
  s.deleted = true;
  const request = fetch(s.resource, {
    method: "DELETE",
    headers: { Authorization: `Bearer ${s.link.token}` },
    keepalive: true,
  }).catch(() => {});
  return waitMs ? Promise.race([request, new Promise((resolve) => setTimeout(resolve, waitMs))]) : request;
}

export async function leave() {
  const s = app.current;
  if (!s || !alive(s) || s.leaving) return;
  s.leaving = true;
  el.leaveBtn.disabled = true;
  await deleteWatch(s, LEAVE_WAIT_MS); // before the connection closes, so the server ends it as deleted
  release(s);
  hook.ended = { code: "left", reason: "left" };
  const text = "You left. The world goes on for its driver.";
  setState("closed", text, "watch");
  showStatus(text);
}

// The page is going away: no time to wait for the DELETE's answer.
export function leaveNow() {
  const s = app.current;
  if (!s || !alive(s)) return;
  s.leaving = true;
  deleteWatch(s);
  release(s);
}

export function watchAgain() {
  const s = app.current;
  if (s && s.link) watch(s.link);
}

function showStatus(text) {
  el.watchStatus.textContent = text;
}

// `spectators` counts everyone watching, this page too.
function showCount(s) {
  if (!alive(s) || hook.state !== "streaming") return;
  const n = hook.stats.serverStats && hook.stats.serverStats.spectators;
  if (typeof n !== "number" || n <= 1) showStatus("Watching.");
  else showStatus(`Watching with ${n - 1} other ${n === 2 ? "spectator" : "spectators"}.`);
}
