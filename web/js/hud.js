// What the page shows about the stream and the model's keys: the HUD's numbers, where a branch came
// from, its stage timeline strip, and the Controls help built from GET /v1/model `accepts`. Drawing
// only: the numbers are measured in latency.js and by the server, and nothing here changes the session.

import { api } from "./api.js";
import { el } from "./dom.js";
import { currentFps, G2G_WINDOW, percentile } from "./latency.js";
import { app, heldKeys, hook, lookAccepted } from "./state.js";

const TIMELINE_POLL_MS = 1000; // the HUD strip's refresh (GET …/timeline)
const TIMELINE_WINDOW_S = 6; // seconds of the session the HUD strip shows

const fmt = (v, digits) => (v === null || v === undefined || !Number.isFinite(v) ? "–" : v.toFixed(digits));

export function renderHud() {
  const st = hook.stats;
  const s = app.current;
  const live = s && !s.closing;
  if (live) st.fps = currentFps(s, performance.now());
  el.hudFps.textContent = live && st.framesDisplayed > 0 ? fmt(st.fps, 1) : "–";

  const server = st.serverStats;
  let periodS = server && typeof server.chunk_period_p50_s === "number" ? server.chunk_period_p50_s : null;
  if (periodS === null && s && s.chunkArrivals.length >= 3) {
    const gaps = s.chunkArrivals.slice(1).map((t, i) => t - s.chunkArrivals[i]);
    periodS = percentile(gaps, 0.5) / 1000;
  }
  el.hudChunkPeriod.textContent = periodS === null ? "–" : `${fmt(periodS, 2)} s`;
  const chunk = st.lastChunk;
  const fps = (app.modelInfo && app.modelInfo.fps) || (server && server.fps) || null;
  if (periodS !== null && chunk && chunk.num_frames && fps) {
    const media = chunk.num_frames / fps;
    el.hudChunkPeriod.title = `chunk media ${media.toFixed(2)} s: ${periodS <= media ? "keeping up" : "slower than real time"}`;
  }

  el.hudLatency.textContent = latencyText(st);
  el.hudFirstFrame.textContent = st.firstFrameS === null ? "–" : `${fmt(st.firstFrameS, 2)} s`;
  el.hudDrops.textContent = server ? `${server.frames_dropped ?? 0} / ${server.frames_repeated ?? 0}` : "–";
  const predicted = server ? server.predicted_control_to_frame_s : null;
  const serverMeasured = server ? server.control_to_frame_p50_s : null;
  el.hudPredicted.textContent = typeof predicted === "number"
    ? `${Math.round(1000 * predicted)} ms` + (typeof serverMeasured === "number" ? ` · server ${Math.round(1000 * serverMeasured)}` : "")
    : "–";
  el.hudBuffered.textContent = server && typeof server.buffered_ms === "number" ? `${Math.round(server.buffered_ms)} ms` : "–";
  el.hudRepeats.textContent = server && typeof server.repeats_per_s === "number" ? fmt(server.repeats_per_s, 1) : "–";
  el.hudRtt.textContent = st.rttMs === null ? "–" : `${Math.round(st.rttMs)} ms`;
  el.hudSpectators.textContent = server && typeof server.spectators === "number" ? String(server.spectators) : "–";
  // A spectator holds no keys: its row shows the driver's, as the last chunk applied them.
  const keys = hook.role === "spectator" ? (chunk && chunk.applied_keys) || [] : live ? heldKeys(s) : [];
  el.hudKeys.textContent = live && keys.length ? keys.join(" ").toUpperCase() : "–";
  el.hudPrompt.textContent = (chunk && describeReceipt(chunk.prompt)) || "–";
  el.hudPromptLatency.textContent = st.promptMs === null ? "–" : `${Math.round(st.promptMs)} ms`;
  const turnLeftS = hook.turnEndsAt === null ? null : Math.max(0, (hook.turnEndsAt - performance.now()) / 1000);
  el.hudTurnRow.hidden = turnLeftS === null;
  el.hudTurn.textContent = turnLeftS === null ? "–" : `ends in ${Math.ceil(turnLeftS)} s`;
}

// ---- the parent: the snapshot a branch (or a rewound session) goes on from ----

// `parent`: {snapshot_id, session_id, chunk_index} from the create, `ready` or `rewound`, or null;
// `ownId`: the live session's. Its own snapshot makes it a session rewound, not a branch of another.
export function showParent(parent, ownId) {
  const p = parent && typeof parent === "object" && parent.session_id ? parent : null;
  hook.parent = p;
  el.hudParentRow.hidden = !p;
  if (!p) return;
  const own = p.session_id === ownId;
  el.hudParent.previousElementSibling.textContent = own ? "rewound to" : "branch of";
  el.hudParent.textContent = own ? `chunk ${p.chunk_index}`
    : `${String(p.session_id).slice(0, 6)} @ chunk ${p.chunk_index}`;
  el.hudParent.title = `snapshot ${p.snapshot_id} of session ${p.session_id}: goes on at chunk ${p.chunk_index}`;
}

// ---------------------------------------------------------------- the HUD's stage timeline
//
// A strip in the HUD (key T, or the button under the controls): the last few seconds of the
// session's GET …/timeline, drawn as benchmarks/timeline.py draws a whole run: a lane per stage
// (and rank) with a bar per chunk, the pacer's buffer level, and a red tick per repeated frame.

const LANE_COLOURS = { encode: "#4c78a8", dit: "#f58518", decode: "#54a24b" };
let timelineTimer = null;

export function toggleTimeline() {
  const on = el.hudStrip.hidden;
  el.hudStrip.hidden = !on;
  el.timelineBtn.setAttribute("aria-pressed", String(on));
  el.timelineBtn.textContent = on ? "Hide the stage timeline" : "Show the stage timeline";
  clearInterval(timelineTimer);
  timelineTimer = on ? setInterval(pollTimeline, TIMELINE_POLL_MS) : null;
  if (on) pollTimeline();
}

async function pollTimeline() {
  const s = app.current;
  if (!s || s.closing || !s.id || hook.state !== "streaming") return;
  const url = `${s.url}/timeline?window_s=${TIMELINE_WINDOW_S}`;
  try {
    const report = await api("GET", url, undefined, s.token);
    if (s !== app.current || el.hudStrip.hidden) return;
    hook.timeline = report;
    drawTimeline(report);
  } catch (_) { /* the next poll tries again; the strip keeps the last picture */ }
}

function timelineLanes(report) {
  const lanes = new Set();
  for (const c of report.chunks) {
    for (const stage of Object.keys(c.stage_spans_s)) {
      const ranks = (c.rank_spans_s || {})[stage];
      if (ranks) ranks.forEach((_, r) => lanes.add(`${stage} r${r}`));
      else lanes.add(stage);
    }
  }
  const order = ["encode", "dit", "decode"];
  return [...lanes].sort((a, b) => order.indexOf(a.split(" ")[0]) - order.indexOf(b.split(" ")[0]) || a.localeCompare(b));
}

function drawTimeline(report) {
  const canvas = el.hudTimeline;
  const ctx = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  const end = report.now_s;
  const start = end - TIMELINE_WINDOW_S;
  const x = (t) => ((t - start) / TIMELINE_WINDOW_S) * w;
  const lanes = timelineLanes(report);
  const rows = lanes.length + 1; // + the buffer
  const rowH = h / rows;
  ctx.clearRect(0, 0, w, h);
  ctx.font = "10px ui-monospace, monospace";
  let bars = 0;
  for (const c of report.chunks) {
    for (const [stage, span] of Object.entries(c.stage_spans_s)) {
      const ranks = (c.rank_spans_s || {})[stage];
      (ranks || [span]).forEach(([a, b], r) => {
        const lane = lanes.indexOf(ranks ? `${stage} r${r}` : stage);
        ctx.fillStyle = LANE_COLOURS[stage] || "#888";
        ctx.fillRect(x(a), lane * rowH + 2, Math.max(1, x(b) - x(a)), rowH - 4);
        bars += 1;
      });
    }
  }
  const pacer = report.pacer || { t_s: [], buffered_frames: [], repeated: [] };
  const top = Math.max(1, ...pacer.buffered_frames);
  const base = h - 2;
  ctx.strokeStyle = "#c39bd3";
  ctx.beginPath();
  pacer.t_s.forEach((t, i) => {
    const y = base - (rowH - 4) * (pacer.buffered_frames[i] / top);
    if (i === 0) ctx.moveTo(x(t), y);
    else ctx.lineTo(x(t), y);
  });
  ctx.stroke();
  ctx.fillStyle = "#ff4d4d";
  const repeats = pacer.t_s.filter((t, i) => pacer.repeated[i]);
  for (const t of repeats) ctx.fillRect(x(t), base - rowH + 4, 1.5, rowH - 4);
  const level = pacer.buffered_frames.length ? pacer.buffered_frames[pacer.buffered_frames.length - 1] : 0;
  hook.timelineDrawn = { lanes, bars, repeats: repeats.length };
  canvas.setAttribute("aria-label", `Stage timeline of the last ${TIMELINE_WINDOW_S} s: ${report.chunks.length} chunks ` +
    `over ${lanes.join(", ")}; ${level} frames buffered; ${repeats.length} repeated frames.`);
}

// ---- the Controls help: only what this model steers by (GET /v1/model `accepts`) ----
//
// Models differ: the camera ones take W A S D, I J K L and the mouse, a Temple Run one jumps on W
// and has no mouse look. Other keys still reach the server, which ignores them, so the help lists
// only the accepted ones. The R, P and T lines are the page's and the server's own, whatever the model.

const ALIAS_NAMES = { // browser key alias → [key cap, spoken name]
  arrowup: ["\u2191", "up arrow"],
  arrowdown: ["\u2193", "down arrow"],
  arrowleft: ["\u2190", "left arrow"],
  arrowright: ["\u2192", "right arrow"],
};

function keyCap(text) {
  const span = document.createElement("span");
  span.className = "kbd";
  span.textContent = text;
  return span;
}

// [{caps: [[cap, spoken]…], meaning}] in the server's order; keys sharing a meaning share a line.
function keyHelpLines(info) {
  const accepts = info.accepts;
  const keys = (accepts.keys || []).map(String);
  const meanings = accepts.meanings && typeof accepts.meanings === "object" ? accepts.meanings : {};
  const aliases = {}; // canonical key → its aliases
  for (const [alias, key] of Object.entries((info.controls && info.controls.key_aliases) || {})) {
    (aliases[key] = aliases[key] || []).push(alias);
  }
  const byMeaning = new Map();
  const described = new Set();
  for (const [key, meaning] of Object.entries(meanings)) {
    if (!keys.includes(key)) continue; // a meaning for a key the model ignores: not advertised
    const text = String(meaning);
    if (!byMeaning.has(text)) byMeaning.set(text, []);
    byMeaning.get(text).push(key);
    described.add(key);
  }
  // Accepted keys the server gives no meaning for still steer something.
  const rest = keys.filter((k) => !described.has(k));
  if (rest.length) byMeaning.set(byMeaning.size ? "also steer" : "steer", rest);
  return [...byMeaning].map(([meaning, ks]) => ({
    meaning,
    caps: ks.flatMap((k) => [[k.toUpperCase(), k.toUpperCase()],
      ...(aliases[k] || []).map((a) => ALIAS_NAMES[a] || [a, a])]),
  }));
}

// Read before any model is known, so a server without `accepts` gets index.html's wording back.
const staticVideoLabel = el.videoBox.getAttribute("aria-label");

export function renderKeyHelp(info) {
  const accepts = info.accepts;
  const known = Boolean(accepts) && typeof accepts === "object";
  const look = lookAccepted();
  const lines = known ? keyHelpLines(info) : [];
  el.keyHelp.replaceChildren(...lines.map(({ caps, meaning }) => {
    const li = document.createElement("li");
    li.dataset.key = caps[0][0].toLowerCase();
    caps.forEach(([cap], i) => {
      if (i) li.append(" or ");
      li.append(keyCap(cap));
    });
    li.append(`: ${meaning}`);
    return li;
  }));
  el.keyHelp.hidden = lines.length === 0;
  // Without `accepts` (an older server) the static help stands as written.
  el.controlsHelp.querySelectorAll("[data-help='keys']").forEach((n) => { n.hidden = known; });
  el.controlsHelp.querySelector("[data-help='mouse']").hidden = !look;
  el.controlsHelp.querySelector("[data-help='touch-look']").hidden = !look;
  if (!known) {
    el.videoBox.setAttribute("aria-label", staticVideoLabel);
    return;
  }
  const spoken = lines.map(({ caps, meaning }) => `${caps.map(([, name]) => name).join(" or ")} ${meaning}`);
  if (look) spoken.push("click to look around with the mouse");
  spoken.push("R resets the camera", "P saves a snapshot", "T shows the stage timeline");
  el.videoBox.setAttribute("aria-label", `Generated world. While it streams: ${spoken.join(", ")}.`);
}

export function wireHud() {
  el.timelineBtn.addEventListener("click", toggleTimeline);
}

// A chunk's receipt (its `prompt`: what that chunk's DiT read): the prompt, and during a transition
// how far it has come.
function describeReceipt(receipt) {
  if (!receipt || typeof receipt.text !== "string") return null;
  const text = receipt.text || "(no prompt)";
  if (typeof receipt.weight !== "number") return text;
  return `${text} · ${Math.round(100 * receipt.weight)}% from “${receipt.from || "no prompt"}”`;
}

// A press waits anywhere from none to a whole chunk for the next sample of the controls, so a few
// presses say little about the median: under P50_MIN_SAMPLES the HUD shows the last one and the count.
const P50_MIN_SAMPLES = 10;

export function latencyText(st) {
  if (st.g2gLastMs === null || st.g2gLastMs === undefined) return "–";
  const last = Math.round(st.g2gLastMs);
  if (st.g2gSamples < P50_MIN_SAMPLES) return `last ${last} ms (${st.g2gSamples} of ${P50_MIN_SAMPLES} presses for a p50)`;
  return `${Math.round(st.g2gP50Ms)} ms p50 of ${Math.min(st.g2gSamples, G2G_WINDOW)} · last ${last}`;
}
