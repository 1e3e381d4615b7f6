// A session's life: create it over REST (from a start image, or from a snapshot: a branch), offer/
// answer the WebRTC connection, run its data channels, read the server's messages, and end it (stop,
// done, lost, failed) with a retry when retrying can help. Everything that can end a session goes
// through teardown(), so timers, the peer connection and the server-side session (DELETE) are
// released exactly once.
// Wire formats: server/wire/protocol.py.

import { ApiError, api, describeApiError, sentence, transient } from "./api.js";
import { send, startLookLoop } from "./controls.js";
import { el } from "./dom.js";
import { renderHud, showParent } from "./hud.js";
import { onChunk, startFrameWatch } from "./latency.js";
import {
  alive, armFirstFrameTimer, getIceServers, newConnection, onMessages, releasePeer, resetStats, showVideo,
  waitIceGathering, watchConnection,
} from "./peer.js";
import { hideShare, showShare, showWatching } from "./share.js";
import { waitInLine } from "./waiting.js";
import { app, heldKeys, hook, rememberLineToken } from "./state.js";
import { setState, showMessage, showModel, updateControls } from "./status.js";

// ---- client timings (the server's limits arrive with GET /v1/model) ----
const PING_INTERVAL_MS = 1000; // for the HUD's round-trip time only: the server watches the connection
const ICE_GATHER_TIMEOUT_MS = 5000; // no trickle: wait for gathering, but not forever
const CONNECT_TIMEOUT_MS = 20000; // answer applied → control channel open (the server's ICE limit is 15 s)
const FIRST_FRAME_TIMEOUT_MS = 90000; // channel open → first frame: model compute, generous for big models
const RECONNECT_DELAYS_MS = [1000, 2000, 4000];
const RECONNECT_RESET_AFTER_MS = 10000; // a session that streamed this long earns fresh reconnect attempts
const BRANCH_CLOSE_WAIT_MS = 3000; // a branch waits this long at most for the current session's DELETE

// What a person can do about an error the server reports by code (server/common/errors.py): permanent
// errors offer a fix on the overlay's button; transient ones (busy, not ready, no network) are
// retried with backoff instead.
const FIX_FOR_CODE = { bad_image: "image", too_large: "image", unknown_scene: "scene", unauthorized: "token" };

let reconnectAttempt = 0;
let reconnectTimer = null;

function newSession(body, startedAt) {
  return {
    ...newConnection(startedAt),
    body,
    id: null,
    url: null, // the session's REST resource, on the node that holds it (set with id)
    token: null,
    done: null, // reason from the server's "done"
    failed: null, // message of a session_failed error that came before "done"
    line: null, // its line (state.js lineTokens): its own id, or the line of the snapshot it branched from
    snapshotsUrl: null, // POST here to save a snapshot (snapshots.js)
    deleting: null, // the DELETE's promise, once sent
  };
}

// `line`: for a branch (body {snapshot}), the line its snapshot belongs to, whose token the create
// carries; null starts a line of its own.
export async function start(body, startedAt, { isReconnect = false, line = null } = {}) {
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  if (app.current) teardown(app.current, { sendStop: true });
  const s = newSession(body, startedAt);
  app.current = s;
  app.lastBody = body;
  app.lastLine = line;
  if (!isReconnect) reconnectAttempt = 0;
  resetStats();
  showParent(null);
  hook.rewound = null;
  const branching = Boolean(body.snapshot);
  setState("connecting", isReconnect ? "Reconnecting: starting a new session…"
    : branching ? "Branching from the snapshot…" : "Starting a session…");
  showMessage("", false);

  try {
    let created = await api("POST", "/v1/sessions", body, line ? app.lineTokens.get(line) : undefined);
    if (created.ticket_id) {
      // Every seat is taken: wait in line (waiting.js), then go on with the session the ticket gets.
      const ready = await waitInLine(s, created);
      if (!ready || !alive(s)) return;
      created = ready.session;
      // The seat is kept for connect_by_s: the page connects at once and says how long it has.
      const within = Math.max(1, Math.floor(ready.connect_by_s || 0));
      setState("connecting", `Your turn! Connecting (the seat is kept ${within} s)…`);
    }
    s.id = created.session_id;
    // Behind a balancer the session lives on one node: its routes are the URLs the create returned.
    s.url = created.session_url || `/v1/sessions/${encodeURIComponent(s.id)}`;
    s.token = created.token || null;
    s.line = line || s.id;
    if (s.token) rememberLineToken(s.line, s.token); // the newest of the line: its sessions may be gone
    s.snapshotsUrl = created.snapshots_url || `${s.url}/snapshots`;
    showParent(created.parent, s.id);
    app.recorded = { url: s.url, token: s.token, id: s.id };
    updateControls();
    if (!alive(s)) {
      deleteSession(s); // stopped while the create request was in flight
      return;
    }
    showShare(s, created);
    hook.sessionId = s.id;
    setState("connecting", "Connecting the video stream…");

    // The create response carries STUN/TURN servers with TURN credentials minted for this session.
    const iceServers = Array.isArray(created.ice_servers) ? created.ice_servers : await getIceServers();
    if (!alive(s)) return;
    const pc = new RTCPeerConnection({ iceServers });
    s.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    const dc = pc.createDataChannel("control", { ordered: true });
    s.dc = dc;
    wirePeer(s, pc);
    wireChannel(s, dc, true);

    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc, ICE_GATHER_TIMEOUT_MS);
    if (!alive(s)) return;
    const local = pc.localDescription;
    const answer = await api("POST", created.offer_url || `${s.url}/offer`,
      { sdp: local.sdp, type: local.type }, s.token);
    if (!alive(s)) return;
    await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type || "answer" });
    armFirstFrame(s, CONNECT_TIMEOUT_MS, "No connection within 20 s. The network may block WebRTC " +
      "(UDP), or the server may need a TURN server (GET /v1/ice-servers).");
    startFrameWatch(s, () => setState("streaming", ""));
    startLookLoop(s);
  } catch (err) {
    if (!alive(s)) return;
    const doing = branching ? "Could not branch from the snapshot" : "Could not start the session";
    const text = describeApiError(err, doing);
    if (transient(err)) {
      fail(s, text, { retry: true, code: err.code, retryAfterS: err.retryAfterS });
      return;
    }
    const code = err instanceof ApiError ? err.code : null;
    if (code === "unknown_scene") app.choice = null; // the list is stale: the fix reloads it
    fail(s, text, { retry: false, code, action: fixFor(code, body) });
  }
}

// A branch is refused over its snapshot (gone) or its line's token: neither another start image nor
// the API token fixes that, and a snapshot once gone does not come back.
function fixFor(code, body) {
  if (body.snapshot) return ["snapshot_gone", "unauthorized", "forbidden"].includes(code) ? null : "reconnect";
  return FIX_FOR_CODE[code] || "reconnect";
}

// The last create again (a reconnect, or "Start again"): a branch branches again from its snapshot.
export function restart({ isReconnect = false } = {}) {
  return start(app.lastBody, performance.now(), { isReconnect, line: app.lastLine });
}

// A new session that goes on from a snapshot of `line`, in place of the current one. That one is
// closed first and its DELETE awaited: it may hold the server's only session slot.
export async function branch(snapshotId, line) {
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  const old = app.current;
  if (old && !old.closing) {
    teardown(old, { sendStop: true });
    setState("connecting", "Closing this session to branch from the snapshot…");
    await Promise.race([old.deleting, new Promise((resolve) => setTimeout(resolve, BRANCH_CLOSE_WAIT_MS))]);
    if (app.current !== old || hook.state !== "connecting") return; // Stop or Start came meanwhile
  }
  await start({ snapshot: snapshotId }, performance.now(), { line });
}

// No video in time: the error says why, and a new try would most likely meet the same.
function armFirstFrame(s, ms, text) {
  armFirstFrameTimer(s, ms, () => fail(s, text, { retry: false }));
}

function wirePeer(s, pc) {
  showVideo(s, pc);
  pc.ondatachannel = (ev) => wireChannel(s, ev.channel, false); // a server-opened "status" channel
  watchConnection(s, pc, lost);
}

function wireChannel(s, ch, isControl) {
  onMessages(s, ch, onServerMessage);
  if (!isControl) return;
  ch.onopen = () => {
    if (s !== app.current) return;
    armFirstFrame(s, FIRST_FRAME_TIMEOUT_MS, "Connected, but the server sent no video within 90 s.");
    // Keys pressed while connecting are sent as one state; then a ping every second for the RTT.
    send(s, { type: "control_state", controls: heldKeys(s) });
    s.timers.ping = setInterval(() => send(s, { type: "ping" }), PING_INTERVAL_MS);
  };
  ch.onclose = () => {
    if (s !== app.current || s.closing) return;
    if (s.done !== null) finish(s, s.done);
    else lost(s, "The control channel closed unexpectedly.");
  };
}

// The server may close a session on its own (done), or the network may drop it (lost).
function finish(s, reason) {
  if (s !== app.current) return;
  teardown(s, { sendStop: false });
  if (s.failed) {
    hook.error = `The session failed: ${s.failed}`;
    hook.errorCode = "session_failed";
    setState("error", hook.error, "restart");
  } else {
    setState("closed", `The session ended: ${sentence(reason || "closed by the server")}`, "restart");
  }
}

function lost(s, text) {
  if (s !== app.current || s.closing) return;
  const streamedLong = s.firstFrameAt !== null && performance.now() - s.firstFrameAt > RECONNECT_RESET_AFTER_MS;
  if (streamedLong) reconnectAttempt = 0;
  fail(s, text, { retry: s.firstFrameAt !== null });
}

// One place for a session's error: the overlay, with the button that can help (see FIX_FOR_CODE).
function fail(s, text, { retry, code = null, action = "reconnect", retryAfterS = null }) {
  if (s !== app.current) return;
  teardown(s, { sendStop: true });
  hook.error = text;
  hook.errorCode = code;
  if (retry && reconnectAttempt < RECONNECT_DELAYS_MS.length) {
    const delay = Math.max(RECONNECT_DELAYS_MS[reconnectAttempt++], 1000 * (retryAfterS || 0));
    reconnectTimer = setTimeout(() => {
      reconnectTimer = null;
      if (app.current === s && app.lastBody) restart({ isReconnect: true });
    }, delay);
    setState("error", `${text} Trying again in ${Math.round(delay / 1000)} s (new session)…`, null);
  } else {
    setState("error", text, action);
  }
}

export function stop() {
  clearTimeout(reconnectTimer);
  reconnectTimer = null;
  const s = app.current;
  if (!s) return;
  teardown(s, { sendStop: true });
  setState("closed", "Stopped. Press Start to begin again.", null);
}

// Idempotent; leaves app.current pointing at s so late events from it are recognised and ignored.
export function teardown(s, { sendStop }) {
  if (s.closing) return;
  if (sendStop) send(s, { type: "stop" });
  releasePeer(s);
  if (document.pointerLockElement) document.exitPointerLock();
  hideShare(s); // its spectators end with it: the link opens nothing any more
  deleteSession(s);
}

function deleteSession(s) {
  if (!s.id || s.deleted) return;
  s.deleted = true;
  const headers = s.token ? { Authorization: `Bearer ${s.token}` } : {};
  // keepalive lets the DELETE finish while the page unloads; 404 (already gone) is fine.
  s.deleting = fetch(s.url, { method: "DELETE", headers, keepalive: true }).catch(() => {});
}

// ---------------------------------------------------------------- server messages

function onServerMessage(s, msg) {
  const info = app.modelInfo;
  switch (msg.type) {
    case "ready":
      if (info) Object.assign(info, { width: msg.width, height: msg.height, fps: msg.fps });
      showModel(msg.model, msg.weights || (info && info.weights));
      showParent(msg.parent, s.id);
      break;
    case "rewound":
      // POST …/restore took: on this same connection, the frames from here on go on from the snapshot.
      hook.rewound = msg.parent || null;
      showParent(msg.parent, s.id);
      if (msg.parent) {
        showMessage(`Rewound to chunk ${msg.parent.chunk_index}: the world goes on from the snapshot.`, false);
      }
      break;
    case "chunk":
      onChunk(s, msg);
      break;
    case "stats":
      hook.stats.serverStats = msg;
      showWatching(s, msg.spectators);
      break;
    case "pong":
      if (typeof msg.t === "number") hook.stats.rttMs = performance.now() - msg.t;
      break;
    case "error":
      if (msg.code === "session_failed") {
        s.failed = sentence(msg.message || "the session failed"); // shown when its "done" comes
      } else {
        hook.error = `Server: ${sentence(msg.message || "error")}`;
        hook.errorCode = msg.code || null;
        el.hudError.textContent = hook.error;
      }
      break;
    case "turn_ending":
      // Someone waits for this seat: the HUD counts down to the turn's end (then `done` turn_over).
      hook.turnEndsAt = performance.now() + 1000 * msg.seconds_left;
      renderHud();
      break;
    case "done":
      s.done = msg.reason || "done";
      finish(s, s.done);
      break;
    default:
      break;
  }
}
