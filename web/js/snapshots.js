// The driver's snapshots. Save (the button, or key P) asks the server to keep the world: it copies
// the generation state at the next chunk boundary, which can take a few seconds. Each snapshot kept
// gets a thumbnail in the strip, drawn from the video at the moment Save was pressed (what the driver
// chose to keep), and a thumbnail opens two actions: Branch (a new session that goes on from it, in
// place of this one) and Rewind (this session goes back to it, on the same connection); × forgets it.
// The strip outlives the sessions: a snapshot opens with the token of any session of its line
// (state.js lineTokens), so those of a session that has ended stay usable by its branches. It
// outlives the page too: on load it lists the snapshots of the lines this browser remembers
// (GET /v1/snapshots), those a server with WORLDRTC_SNAPSHOT_DIR kept across a restart included.
// Wire formats: server/wire/protocol.py (SnapshotInfo, RestoreRequest, RewoundMsg).

import { ApiError, api, describeApiError } from "./api.js";
import { el } from "./dom.js";
import { branch } from "./session.js";
import { app, hook } from "./state.js";
import { showMessage, updateControls } from "./status.js";

const THUMB_WIDTH_PX = 96; // CSS pixels; the height keeps the video's aspect

const snaps = []; // {info: SnapshotInfo, line, node}, oldest first
let rewinding = false;

function liveSession() {
  const s = app.current;
  return s && !s.closing && s.id && hook.state === "streaming" ? s : null;
}

// ---------------------------------------------------------------- Save

export async function save() {
  const s = liveSession();
  if (!s || hook.saving) return;
  const picture = grabFrame();
  setSaving(true);
  try {
    const info = await api("POST", s.snapshotsUrl, undefined, s.token);
    if (!info || !info.snapshot_id) throw new Error("the server's answer names no snapshot");
    add(info, s.line, picture);
    showMessage(`Saved the world at chunk ${info.chunk_index}.`, false);
  } catch (err) {
    showMessage(saveError(err), true);
  } finally {
    setSaving(false);
  }
}

function setSaving(on) {
  hook.saving = on;
  el.saveBtn.textContent = on ? "Saving\u2026" : "Save";
  updateControls();
}

// A server without snapshots has no such route (its 404 says only "Not Found"): say what that means.
function saveError(err) {
  const noRoute = err instanceof ApiError && (err.status === 404 || err.status === 405) &&
    /^(not found|method not allowed)$/i.test(err.message);
  return noRoute ? "This server does not save snapshots." : describeApiError(err, "Could not save a snapshot");
}

// The video as it is now, small. The server keeps the state a few frames on (at the chunk boundary),
// but this is the picture the driver chose to keep.
function grabFrame() {
  const v = el.video;
  const scale = Math.min(2, window.devicePixelRatio || 1); // sharp on a high-density screen
  const aspect = v.videoWidth && v.videoHeight ? v.videoHeight / v.videoWidth : 9 / 16;
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(THUMB_WIDTH_PX * scale);
  canvas.height = Math.max(1, Math.round(THUMB_WIDTH_PX * aspect * scale));
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  if (v.videoWidth) {
    try {
      ctx.drawImage(v, 0, 0, canvas.width, canvas.height);
    } catch (_) { /* no frame to draw: the thumbnail stays black */ }
  }
  return canvas;
}

// ---------------------------------------------------------------- the strip

// On load: the snapshots of the lines this browser drove before, oldest first, as placeholders
// (their pictures were drawn in another visit). A line the server no longer knows is forgotten.
export async function restoreStrip() {
  const found = [];
  for (const [line, token] of app.lineTokens) {
    try {
      const listed = await api("GET", "/v1/snapshots", undefined, token);
      for (const info of listed.snapshots || []) found.push({ info, line: info.line || line });
    } catch (_) { /* the server forgot the line (restarted without saves, or it ended long ago) */ }
  }
  found.sort((a, b) => a.info.created - b.info.created);
  for (const { info, line } of found) {
    if (!snaps.some((s) => s.info.snapshot_id === info.snapshot_id)) add(info, line, placeholder(info));
  }
}

function placeholder(info) {
  const canvas = document.createElement("canvas");
  canvas.width = THUMB_WIDTH_PX;
  canvas.height = Math.round(THUMB_WIDTH_PX * 9 / 16);
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#1b2030";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#9aa3b5";
  ctx.font = "11px sans-serif";
  ctx.textAlign = "center";
  ctx.fillText(`saved · chunk ${info.chunk_index}`, canvas.width / 2, canvas.height / 2 + 4);
  return canvas;
}

function formatBytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n) || n < 0) return "size unknown";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let v = n;
  let i = 0;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

function button(className, text, title) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  if (title) b.title = title;
  return b;
}

function add(info, line, picture) {
  const snap = { info, line, node: null };
  snap.node = thumbnail(snap, picture);
  snaps.push(snap);
  el.snapStrip.append(snap.node);
  el.snapshots.hidden = false;
  el.snapStrip.scrollLeft = el.snapStrip.scrollWidth; // the newest in view
  publish();
}

function thumbnail(snap, picture) {
  const { info } = snap;
  const id = info.snapshot_id;
  const at = `chunk ${info.chunk_index}`;
  const li = document.createElement("li");
  li.className = "snap";
  li.dataset.id = id;

  const pick = button("snap-pick", "");
  pick.setAttribute("aria-expanded", "false");
  pick.setAttribute("aria-controls", `snap-actions-${id}`);
  const when = typeof info.created === "number" ? new Date(info.created * 1000).toLocaleTimeString() : "";
  pick.title = `Snapshot ${id} of session ${info.session_id}${when ? `, saved at ${when}` : ""}: ` +
    "branch from it or rewind to it";
  picture.setAttribute("aria-hidden", "true");
  // "chunk 12 · 3.1 MB", which wraps (if it must) only between the two: see .snap-label in style.css.
  const label = document.createElement("span");
  label.className = "snap-label";
  const size = document.createElement("span");
  size.textContent = formatBytes(info.bytes);
  const chunk = document.createElement("span");
  chunk.textContent = at;
  label.append(chunk, " \u00b7 ", size);
  pick.append(picture, label);
  pick.addEventListener("click", () => toggle(snap));

  const del = button("snap-delete", "\u00d7", "Delete");
  del.setAttribute("aria-label", `Delete the snapshot at ${at}`);
  del.addEventListener("click", () => forget(snap));

  const actions = document.createElement("div");
  actions.className = "snap-actions";
  actions.id = `snap-actions-${id}`;
  actions.setAttribute("role", "group");
  actions.setAttribute("aria-label", `Snapshot at ${at}`);
  actions.hidden = true;
  const branchBtn = button("btn snap-branch", "Branch", "A new session that goes on from here, in place of this one");
  const rewindBtn = button("btn snap-rewind", "Rewind", "This session goes back to here, on the same connection");
  rewindBtn.disabled = rewinding;
  branchBtn.addEventListener("click", () => branchFrom(snap));
  rewindBtn.addEventListener("click", () => rewindTo(snap));
  actions.append(branchBtn, rewindBtn);

  li.append(pick, del, actions);
  return li;
}

// One thumbnail's actions open at a time.
function toggle(snap, open = snap.node.querySelector(".snap-actions").hidden) {
  for (const other of snaps) {
    const on = other === snap && open;
    other.node.classList.toggle("open", on);
    other.node.querySelector(".snap-actions").hidden = !on;
    other.node.querySelector(".snap-pick").setAttribute("aria-expanded", String(on));
  }
}

function closeAll() {
  for (const snap of snaps) toggle(snap, false);
}

function publish() {
  hook.snapshots = snaps.map(({ info }) => ({
    snapshot_id: info.snapshot_id, session_id: info.session_id, chunk_index: info.chunk_index, bytes: info.bytes,
  }));
}

function remove(snap) {
  const i = snaps.indexOf(snap);
  if (i < 0) return;
  const hadFocus = snap.node.contains(document.activeElement);
  snaps.splice(i, 1);
  snap.node.remove();
  el.snapshots.hidden = snaps.length === 0;
  publish();
  if (hadFocus) {
    const next = snaps[Math.min(i, snaps.length - 1)];
    if (next) next.node.querySelector(".snap-pick").focus();
    else el.videoBox.focus({ preventScroll: true });
  }
}

// The server no longer has it (evicted from its budget, or lost with a stage): nothing to offer.
function markGone(snap) {
  snap.node.classList.add("gone");
  snap.node.querySelectorAll(".snap-branch, .snap-rewind").forEach((b) => { b.disabled = true; });
  snap.node.querySelector(".snap-pick").title = "The server no longer keeps this snapshot.";
}

const gone = (err) => err instanceof ApiError && (err.status === 410 || err.code === "snapshot_gone");

// ---------------------------------------------------------------- Branch, Rewind, delete

async function branchFrom(snap) {
  closeAll();
  const id = snap.info.snapshot_id;
  el.videoBox.focus({ preventScroll: true }); // keys go to the new world
  await branch(id, snap.line);
  if (app.lastBody && app.lastBody.snapshot === id && hook.errorCode === "snapshot_gone") markGone(snap);
}

async function rewindTo(snap) {
  const s = liveSession();
  if (!s) {
    showMessage("Rewind takes a live session back to the snapshot: Branch starts one from it.", true);
    return;
  }
  if (rewinding) return;
  setRewinding(true);
  closeAll();
  el.videoBox.focus({ preventScroll: true });
  showMessage(`Rewinding to chunk ${snap.info.chunk_index}\u2026`, false);
  try {
    // The "rewound" message on the control channel says when the frames go on from it (session.js).
    await api("POST", `${s.url}/restore`, { snapshot: snap.info.snapshot_id }, s.token);
  } catch (err) {
    if (gone(err)) markGone(snap);
    if (s === app.current) showMessage(describeApiError(err, "Could not rewind"), true);
  } finally {
    setRewinding(false);
  }
}

function setRewinding(on) {
  rewinding = on;
  for (const snap of snaps) {
    if (!snap.node.classList.contains("gone")) snap.node.querySelector(".snap-rewind").disabled = on;
  }
}

async function forget(snap) {
  const del = snap.node.querySelector(".snap-delete");
  del.disabled = true;
  try {
    await api("DELETE", snap.info.snapshot_url, undefined, app.lineTokens.get(snap.line));
  } catch (err) {
    // Already gone (404, 410): forgetting it here is all that is left to do.
    if (!(err instanceof ApiError && (err.status === 404 || gone(err)))) {
      showMessage(describeApiError(err, "Could not delete the snapshot"), true);
      del.disabled = false;
      return;
    }
  }
  remove(snap);
}

export function wireSnapshots() {
  el.saveBtn.addEventListener("click", save);
  el.snapStrip.addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape") return;
    const open = snaps.find((snap) => snap.node.classList.contains("open"));
    if (!open) return;
    closeAll();
    open.node.querySelector(".snap-pick").focus();
  });
}
