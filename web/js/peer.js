// What a driver's session (session.js) and a spectator's watch (spectator.js) share: the record of a
// live connection that latency.js and hud.js read, ICE servers and gathering (no trickle: the offer
// carries every candidate), the video element, a connection that drops, and the release of it all.
// Both go through releasePeer(), so timers, the frame watch and the peer connection end once.

import { api } from "./api.js";
import { el } from "./dom.js";
import { app, hook } from "./state.js";

const LOST_GRACE_MS = 3000; // pc "disconnected"/"failed" this long counts as a lost connection

// The fields latency.js (frames, fps, glass-to-glass) and hud.js read, whichever role holds them.
export function newConnection(startedAt) {
  return {
    startedAt, // performance.now() of the Start click or of the watch (first-frame time counts from here)
    pc: null,
    dc: null,
    seq: 0,
    closing: false,
    firstFrameAt: null,
    timers: { ping: null, firstFrame: null, lost: null, stats: null },
    rvfcHandle: null,
    rafHandle: null,
    heldCodes: new Map(), // event.code → camera key
    look: { dx: 0, dy: 0, lastSent: 0 },
    probes: [], // key changes not yet applied: {seq, sentAt}
    matched: [], // applied by a chunk that has arrived: {seq, sentAt, ptsStart, arrivedAt}
    lastPts: null, // pts of the frame on screen
    ptsImplausible: 0, // chunks whose pts_start could not be a frame in flight (see ptsPlausible)
    rtpOrigin: null, // RTP timestamp of pts 0 (first frame of the session), when the browser exposes it
    g2g: [],
    frameTimes: [], // [time, frames] for the fps window
    shownPts: [], // [pts, time] of recently presented frames, for chunks whose message comes after
    lastPresented: null,
    chunkArrivals: [],
    statsBase: null, // getStats fallback
  };
}

// A new connection's HUD starts from nothing.
export function resetStats() {
  Object.assign(hook.stats, {
    framesDisplayed: 0, fps: 0, firstFrameS: null,
    g2gP50Ms: null, g2gLastMs: null, g2gSamples: 0, g2gRecentMs: [], g2gMethod: null, g2gLog: [],
    chunksReceived: 0, lastChunk: null, serverStats: null, rttMs: null, ptsAheadFrames: null,
  });
  hook.error = null;
  el.hudError.textContent = "";
}

export function alive(s) {
  return s === app.current && !s.closing;
}

export async function getIceServers() {
  try {
    const data = await api("GET", "/v1/ice-servers");
    return Array.isArray(data && data.ice_servers) ? data.ice_servers : [];
  } catch (_) {
    return []; // loopback and LAN work without STUN/TURN
  }
}

export function waitIceGathering(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      pc.removeEventListener("icecandidate", onCandidate);
      resolve();
    };
    const check = () => {
      if (pc.iceGatheringState === "complete") done();
    };
    const onCandidate = (ev) => {
      if (!ev.candidate) done(); // end-of-candidates
    };
    // Past the timeout, send what has been gathered: host candidates come first and are enough locally.
    const timer = setTimeout(done, timeoutMs);
    pc.addEventListener("icegatheringstatechange", check);
    pc.addEventListener("icecandidate", onCandidate);
  });
}

export function showVideo(s, pc) {
  pc.ontrack = (ev) => {
    if (s !== app.current) return;
    const stream = ev.streams && ev.streams[0] ? ev.streams[0] : new MediaStream([ev.track]);
    el.video.srcObject = stream;
    const p = el.video.play();
    if (p && p.catch) p.catch(() => {}); // muted autoplay is allowed; ignore interrupted play()
  };
}

// A connection that stays "disconnected" or "failed" for LOST_GRACE_MS, or closes, is lost: lost(s,
// text) decides what follows. A blip shorter than that only shows in the HUD.
export function watchConnection(s, pc, lost) {
  pc.onconnectionstatechange = () => {
    if (!alive(s)) return;
    const st = pc.connectionState;
    if (st === "connected") {
      clearTimeout(s.timers.lost);
      s.timers.lost = null;
      if (hook.state === "streaming") el.hudError.textContent = "";
    } else if (st === "disconnected" || st === "failed") {
      if (hook.state === "streaming") el.hudError.textContent = `Network ${st}; waiting up to 3 s…`;
      if (!s.timers.lost) {
        s.timers.lost = setTimeout(() => {
          lost(s, `The connection to the server was lost (WebRTC ${pc.connectionState}).`);
        }, LOST_GRACE_MS);
      }
    } else if (st === "closed") {
      lost(s, "The connection to the server closed.");
    }
  };
}

// Waits ms for s's first frame, counting only while the page is visible (hidden tabs present no
// frames), then calls onTimeout.
export function armFirstFrameTimer(s, ms, onTimeout) {
  clearTimeout(s.timers.firstFrame);
  s.timers.firstFrame = setTimeout(function check() {
    if (!alive(s) || s.firstFrameAt !== null) return;
    if (document.hidden) s.timers.firstFrame = setTimeout(check, 1000);
    else onTimeout();
  }, ms);
}

// The data channel's JSON messages, for as long as s is the page's connection.
export function onMessages(s, ch, handle) {
  ch.onmessage = (ev) => {
    if (s !== app.current) return;
    let msg;
    try {
      msg = JSON.parse(ev.data);
    } catch (_) {
      return;
    }
    handle(s, msg);
  };
}

// Idempotent: timers, the frame watch, the channel and the peer connection, and the video element.
export function releasePeer(s) {
  s.closing = true;
  for (const k of Object.keys(s.timers)) {
    clearTimeout(s.timers[k]);
    clearInterval(s.timers[k]);
    s.timers[k] = null;
  }
  if (s.rvfcHandle !== null && el.video.cancelVideoFrameCallback) el.video.cancelVideoFrameCallback(s.rvfcHandle);
  if (s.rafHandle !== null) cancelAnimationFrame(s.rafHandle);
  s.rvfcHandle = s.rafHandle = null;
  s.heldCodes.clear();
  if (s.dc) {
    s.dc.onopen = s.dc.onclose = s.dc.onmessage = null;
    try {
      s.dc.close();
    } catch (_) { /* already closed */ }
  }
  if (s.pc) {
    s.pc.ontrack = s.pc.ondatachannel = s.pc.onconnectionstatechange = null;
    try {
      s.pc.close();
    } catch (_) { /* already closed */ }
  }
  if (s === app.current) el.video.srcObject = null;
}
