// Frames on screen, fps and glass-to-glass control latency: what the stream is doing, measured from
// the browser's side. It only measures (into the session record and hook.stats); what a first frame
// means to the page is the session's business, so that arrives as a callback.
//
// Glass-to-glass control latency (control_to_frame_s, client side). Method:
// 1. Every key change (press, release, control_state on blur, reset_pose) is a probe {seq, sentAt}
//    (sentAt = performance.now() when sent; also the message's `t`).
// 2. The server echoes with each chunk the last control seq it had folded in when it sampled that
//    chunk's controls (applied_seq). The first chunk with applied_seq ≥ seq is the first one
//    generated with the change; probes are matched to it when its "chunk" message arrives.
// 3. The chunk's first frame is the first video frame presented (requestVideoFrameCallback,
//    expectedDisplayTime) after the key change whose RTP pts ≥ the chunk's pts_start: looked up
//    among the last presented frames when the message comes (it comes when the chunk is done,
//    after its first frames may be on screen), else awaited. RTP pts
//    come from metadata.rtpTimestamp relative to the session's first frame, which the server stamps
//    pts 0 (90 kHz clock). Without rtpTimestamp (or pts_start) it is simply the first frame presented
//    after the message, a lower bound when the server's pacer still holds earlier frames.
// Latency = that display time − sentAt: key press to photons, less the display's scan-out.
// Matches waiting longer than MATCH_GIVE_UP_MS (pts that never arrive) are dropped, not guessed.
//
// A typed prompt is measured the same way (hook.stats.promptMs): from Enter to the first frame of the
// first chunk whose receipt (msg.prompt, what its DiT read) names the prompt.

import { el } from "./dom.js";
import { app, hook } from "./state.js";

export const G2G_WINDOW = 50;
const FPS_WINDOW_MS = 2000;
const MATCH_GIVE_UP_MS = 5000;
const SHOWN_PTS_KEPT = 64; // 4 s at 16 FPS: longer than a chunk takes from first frame to message
const VIDEO_CLOCK_HZ = 90000;
const PTS_SLACK_FRAMES = 8; // pacer's extra 4 frames + jitter buffer and decode

// The server's pacer holds at most about one chunk (+4 frames), so a chunk's first frame goes out
// within that many frames of the one on screen when its message arrives. A pts_start further ahead
// is not on the RTP clock (a server that counts pts by frame index drifts by dropped − repeated).
// The chunk message comes when the chunk is done, which can be after its first frames were shown
// (frames stream out as they are decoded): a pts_start up to a chunk behind is plausible too.
function ptsPlausible(s, ptsStart, numFrames) {
  const fps = (app.modelInfo && app.modelInfo.fps) || 16;
  const step = Math.round(VIDEO_CLOCK_HZ / fps);
  const ahead = (ptsStart - s.lastPts) / step;
  hook.stats.ptsAheadFrames = ahead;
  const span = (numFrames || 16) + PTS_SLACK_FRAMES;
  return ahead <= span && ahead >= -span;
}

// When a frame at or after ptsStart was already presented (after sentAt): its time, else null.
function shownAt(s, ptsStart, sentAt) {
  const hit = s.shownPts.find(([pts, at]) => pts >= ptsStart && at >= sentAt);
  return hit ? hit[1] : null;
}

// A prompt sent at `sentAt` (performance.now()): measured when a chunk that read it arrives.
export function notePrompt(s, text, sentAt) {
  s.promptProbe = { text, sentAt };
}

function chunkPtsStart(s, msg) {
  let ptsStart = typeof msg.pts_start === "number" ? msg.pts_start : null;
  if (ptsStart !== null && s.lastPts !== null && !ptsPlausible(s, ptsStart, msg.num_frames)) {
    s.ptsImplausible += 1;
    ptsStart = null; // not on the wire's clock: fall back to the next presented frame
  }
  return ptsStart;
}

export function onChunk(s, msg) {
  const now = performance.now();
  hook.stats.chunksReceived += 1;
  hook.stats.lastChunk = msg;
  s.chunkArrivals.push(now);
  if (s.chunkArrivals.length > 21) s.chunkArrivals.shift();
  const probe = s.promptProbe;
  if (probe && msg.prompt && msg.prompt.text === probe.text) {
    s.promptProbe = null;
    const ptsStart = chunkPtsStart(s, msg);
    const at = ptsStart === null ? null : shownAt(s, ptsStart, probe.sentAt);
    if (at !== null) recordPrompt(at - probe.sentAt);
    else s.matched.push({ prompt: true, sentAt: probe.sentAt, ptsStart, arrivedAt: now });
  }
  const applied = msg.applied_seq;
  if (typeof applied === "number") {
    const ptsStart = chunkPtsStart(s, msg);
    while (s.probes.length && s.probes[0].seq <= applied) {
      const probe = s.probes.shift();
      const at = ptsStart === null ? null : shownAt(s, ptsStart, probe.sentAt);
      if (at !== null) {
        hook.stats.g2gMethod = "rtp-pts";
        recordLatency(s, at - probe.sentAt);
      } else {
        s.matched.push({ ...probe, ptsStart, arrivedAt: now });
      }
    }
  }
  if (!videoFrameCallbacks()) {
    // Without requestVideoFrameCallback we cannot see individual frames; count arrival as display.
    for (const m of s.matched) (m.prompt ? recordPrompt(now - m.sentAt) : recordLatency(s, now - m.sentAt));
    s.matched = [];
    hook.stats.g2gMethod = "chunk-arrival";
  }
}

function videoFrameCallbacks() {
  return typeof el.video.requestVideoFrameCallback === "function";
}

// Watches s's frames until it closes; onFirstFrame() runs once, when its first frame is shown.
export function startFrameWatch(s, onFirstFrame) {
  if (videoFrameCallbacks()) {
    const onFrame = (now, meta) => {
      if (s !== app.current || s.closing) return;
      const shown = meta && typeof meta.expectedDisplayTime === "number" ? meta.expectedDisplayTime : now;
      let frames = 1;
      if (meta && typeof meta.presentedFrames === "number") {
        if (s.lastPresented !== null) frames = Math.max(1, meta.presentedFrames - s.lastPresented);
        s.lastPresented = meta.presentedFrames;
      }
      onFramesShown(s, onFirstFrame, shown, frames, framePts(s, meta));
      s.rvfcHandle = el.video.requestVideoFrameCallback(onFrame);
    };
    s.rvfcHandle = el.video.requestVideoFrameCallback(onFrame);
  } else {
    // Fallback: decoded-frame counts from getStats, twice a second.
    s.timers.stats = setInterval(async () => {
      if (s !== app.current || s.closing || !s.pc) return;
      let decoded = null;
      try {
        const report = await s.pc.getStats();
        report.forEach((r) => {
          if (r.type === "inbound-rtp" && (r.kind === "video" || r.mediaType === "video")) {
            decoded = r.framesDecoded;
          }
        });
      } catch (_) {
        return;
      }
      if (decoded === null || s !== app.current) return;
      const prev = s.statsBase === null ? 0 : s.statsBase;
      s.statsBase = decoded;
      if (decoded > prev) onFramesShown(s, onFirstFrame, performance.now(), decoded - prev);
    }, 500);
  }
}

// The presented frame's pts on the server's 90 kHz clock, or null when the browser does not say.
function framePts(s, meta) {
  if (!meta || typeof meta.rtpTimestamp !== "number") return null;
  if (s.rtpOrigin === null) {
    // The session's first frame has pts 0; if frames were presented before this callback, step back.
    const fps = (app.modelInfo && app.modelInfo.fps) || 16;
    const before = typeof meta.presentedFrames === "number" ? Math.max(0, Math.min(meta.presentedFrames - 1, 64)) : 0;
    s.rtpOrigin = (meta.rtpTimestamp - before * Math.round(VIDEO_CLOCK_HZ / fps)) >>> 0;
  }
  return (meta.rtpTimestamp - s.rtpOrigin) >>> 0; // uint32 RTP clock wraps after ~13 h
}

function onFramesShown(s, onFirstFrame, at, frames, pts = null) {
  if (pts !== null) {
    s.lastPts = pts;
    s.shownPts.push([pts, at]);
    if (s.shownPts.length > SHOWN_PTS_KEPT) s.shownPts.shift();
  }
  hook.stats.framesDisplayed += frames;
  s.frameTimes.push([at, frames]);
  while (s.frameTimes.length && s.frameTimes[0][0] < at - FPS_WINDOW_MS) s.frameTimes.shift();
  if (s.firstFrameAt === null) {
    s.firstFrameAt = at;
    hook.stats.firstFrameS = Math.max(0, at - s.startedAt) / 1000;
    clearTimeout(s.timers.firstFrame);
    s.timers.firstFrame = null;
    onFirstFrame();
  }
  if (s.matched.length) {
    s.matched = s.matched.filter((m) => {
      if (m.nextFrameAt === undefined) m.nextFrameAt = at;
      if (m.prompt && (pts === null || m.ptsStart === null || pts >= m.ptsStart)) {
        recordPrompt(at - m.sentAt);
        return false;
      }
      if (pts === null || m.ptsStart === null || pts >= m.ptsStart) {
        hook.stats.g2gMethod = pts === null || m.ptsStart === null ? "next-frame" : "rtp-pts";
        recordLatency(s, at - m.sentAt);
        // Both estimates, for tests and for judging the method: the last few only.
        hook.stats.g2gLog.push({
          seq: m.seq, ptsStart: m.ptsStart, framePts: pts, chunkMs: m.arrivedAt - m.sentAt,
          nextFrameMs: m.nextFrameAt - m.sentAt, shownMs: at - m.sentAt,
        });
        if (hook.stats.g2gLog.length > 20) hook.stats.g2gLog.shift();
        return false;
      }
      return performance.now() - m.arrivedAt < MATCH_GIVE_UP_MS;
    });
  }
}

function recordPrompt(ms) {
  hook.stats.promptMs = ms;
}

function recordLatency(s, ms) {
  s.g2g.push(ms);
  if (s.g2g.length > G2G_WINDOW) s.g2g.shift();
  hook.stats.g2gLastMs = ms;
  hook.stats.g2gSamples += 1;
  hook.stats.g2gP50Ms = percentile(s.g2g, 0.5);
  hook.stats.g2gRecentMs = [...s.g2g]; // a copy: the window the p50 is of, oldest first, for tests
}

export function percentile(values, q) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

export function currentFps(s, now) {
  const ft = s.frameTimes;
  if (ft.length < 2 || now - ft[ft.length - 1][0] > 1000) return 0;
  const span = ft[ft.length - 1][0] - ft[0][0];
  if (span < 250) return 0;
  let frames = 0;
  for (let i = 1; i < ft.length; i++) frames += ft[i][1];
  return (frames * 1000) / span;
}
