// Steering: keys, mouse look (pointer lock), and on touch screens a stick, hold-to-turn buttons and
// drag-to-look, all turned into the messages of the "control" data channel. Every message the page
// sends goes through send() here, so each one gets its seq (the hook's lastSeq, the server's
// applied_seq) and each key change becomes a latency probe (see latency.js).
//
// The keys come from the server (GET /v1/model `controls`, via adoptControls), so nothing here
// copies its key list or its look limit. R, T and P are the page's own, whatever the model: they are
// read before the model's keys, so none of them is ever also sent as a camera key.

import { el } from "./dom.js";
import { renderHud, toggleTimeline } from "./hud.js";
import { app, heldKeys, hook, lookAccepted } from "./state.js";
import { setState } from "./status.js";

const LOOK_MIN_INTERVAL_MS = 33; // ≤ 30 look messages/s, well under the 120 messages/s limit
const MAX_PENDING_PROBES = 256;
const STICK_DEAD_ZONE = 0.3; // of the stick's radius: smaller drags move nothing
const STICK_KEY_MIN_COS = 0.38; // a move key is held while the stick points within ~68° of it
const TOUCH_LOOK_GAIN = 1.5; // look pixels per CSS pixel of finger travel on the video

const RESET_CODE = "KeyR";
const TIMELINE_CODE = "KeyT";
const SAVE_CODE = "KeyP";

// Physical key (event.code, layout independent, lower-cased) → the camera key the server
// understands, and the server's look limit: both from GET /v1/model.
let keyMap = {};
let moveVectors = {}; // move key → [right, forward]
let turnVectors = {}; // turn key → [yaw right, pitch up]
let maxLookPx = 0;
let saveSnapshot = () => {}; // key P: given by wireControls (snapshots.js saves)

export function adoptControls(info) {
  const c = info.controls;
  keyMap = {};
  for (const k of [...c.move_keys, ...c.turn_keys]) keyMap[`key${k}`] = k;
  Object.assign(keyMap, c.key_aliases); // e.g. arrowup → w
  moveVectors = c.move_vectors || {};
  turnVectors = c.turn_vectors || {};
  maxLookPx = c.max_look_px;
}

export function send(s, msg) {
  if (!s.dc || s.dc.readyState !== "open") return null;
  const seq = ++s.seq;
  hook.lastSeq[msg.type] = seq;
  const t = performance.now();
  try {
    s.dc.send(JSON.stringify({ ...msg, seq, t }));
  } catch (_) {
    return null;
  }
  return { seq, t };
}

function probe(s, sent) {
  if (!sent) return;
  s.probes.push({ seq: sent.seq, sentAt: sent.t });
  if (s.probes.length > MAX_PENDING_PROBES) s.probes.shift();
}

function typingTarget(target) {
  if (!target || target === document.body) return false;
  if (target.isContentEditable) return true;
  const tag = target.tagName;
  return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
}

function sessionActive() {
  const s = app.current;
  return s && !s.closing && (hook.state === "connecting" || hook.state === "streaming");
}

// Keys, the touch stick and the turn buttons all hold camera keys through these two: a "code" is
// whatever holds the key (a physical key's event.code, "stick:w", "button:l"), so W and ArrowUp,
// or the stick and the W key, hold one camera key that is released only when nothing holds it.
function holdKey(s, code, key) {
  if (s.heldCodes.has(code)) return;
  const already = heldKeys(s).includes(key);
  s.heldCodes.set(code, key);
  if (!already) probe(s, send(s, { type: "control", key, action: "press" }));
  renderHud();
}

function releaseCode(s, code) {
  const key = s.heldCodes.get(code);
  if (!key) return;
  s.heldCodes.delete(code);
  if (!heldKeys(s).includes(key)) probe(s, send(s, { type: "control", key, action: "release" }));
  renderHud();
}

function resetPose(s) {
  probe(s, send(s, { type: "reset_pose" }));
}

function onKeyDown(ev) {
  if (ev.key === "Escape" && document.pointerLockElement === el.videoBox) {
    document.exitPointerLock(); // browsers do this themselves; harmless when they already did
    return;
  }
  if (ev.ctrlKey || ev.metaKey || ev.altKey || typingTarget(ev.target)) return;
  if (ev.code === TIMELINE_CODE && !ev.repeat) {
    toggleTimeline();
    return;
  }
  if (!sessionActive()) return;
  const s = app.current;
  const code = ev.code || "";
  if (code === RESET_CODE || (!code && ev.key && ev.key.toLowerCase() === "r")) {
    ev.preventDefault();
    if (!ev.repeat) resetPose(s);
    return;
  }
  if (code === SAVE_CODE || (!code && ev.key && ev.key.toLowerCase() === "p")) {
    ev.preventDefault();
    if (!ev.repeat) saveSnapshot();
    return;
  }
  const key = keyMap[code.toLowerCase()] || keyMap[`key${(ev.key || "").toLowerCase()}`];
  if (!key) return;
  ev.preventDefault(); // no page scrolling on arrows
  if (!ev.repeat) holdKey(s, code, key);
}

function onKeyUp(ev) {
  const s = app.current;
  if (!s || s.closing) return;
  if (s.heldCodes.has(ev.code || "")) {
    ev.preventDefault();
    releaseCode(s, ev.code || "");
  }
}

// ---------------------------------------------------------------- touch
//
// On touch screens: a stick (bottom left) holds the move keys it points at, dragging the video
// looks (the same `look` deltas as the mouse), and hold-to-turn and reset buttons (bottom right).
// Pointer events with pointer capture, so a finger that leaves the control still drives it.

const touchScreen = () => navigator.maxTouchPoints > 0 || window.matchMedia("(pointer: coarse)").matches;

function useTouchUi(on) {
  if (hook.touchUi === on) return;
  hook.touchUi = on;
  document.body.classList.toggle("touch", on);
  setState(hook.state, undefined, hook.action);
}

// The move keys whose direction is within ~68° of the stick's: one key straight on, two diagonally.
function stickKeys(dx, dy) {
  const len = Math.hypot(dx, dy);
  if (len < STICK_DEAD_ZONE) return [];
  const right = dx / len;
  const forward = -dy / len; // screen y grows downwards
  return Object.entries(moveVectors)
    .filter(([, [r, f]]) => (r * right + f * forward) / (Math.hypot(r, f) || 1) >= STICK_KEY_MIN_COS)
    .map(([key]) => key);
}

// The stick holds exactly `keys` (as "stick:<key>" codes), whatever the keyboard holds besides.
function holdStickKeys(s, keys) {
  for (const code of [...s.heldCodes.keys()]) {
    if (code.startsWith("stick:") && !keys.includes(code.slice(6))) releaseCode(s, code);
  }
  for (const key of keys) holdKey(s, `stick:${key}`, key);
}

function wireStick() {
  let pointer = null;
  const move = (ev) => {
    const box = el.stick.getBoundingClientRect();
    const radius = box.width / 2;
    let dx = (ev.clientX - (box.left + radius)) / radius;
    let dy = (ev.clientY - (box.top + radius)) / radius;
    const len = Math.hypot(dx, dy);
    if (len > 1) [dx, dy] = [dx / len, dy / len];
    el.stickKnob.style.transform = `translate(${dx * 50}%, ${dy * 50}%)`;
    if (sessionActive()) holdStickKeys(app.current, stickKeys(dx, dy));
  };
  const end = (ev) => {
    if (ev.pointerId !== pointer) return;
    pointer = null;
    el.stickKnob.style.transform = "";
    el.stick.classList.remove("active");
    if (app.current && !app.current.closing) holdStickKeys(app.current, []);
  };
  el.stick.addEventListener("pointerdown", (ev) => {
    if (pointer !== null) return;
    pointer = ev.pointerId;
    el.stick.setPointerCapture(ev.pointerId);
    el.stick.classList.add("active");
    ev.preventDefault();
    move(ev);
  });
  el.stick.addEventListener("pointermove", (ev) => {
    if (ev.pointerId === pointer) move(ev);
  });
  el.stick.addEventListener("pointerup", end);
  el.stick.addEventListener("pointercancel", end);
}

function wireTurnButton(btn) {
  const yaw = Number(btn.dataset.yaw);
  const code = `button:${btn.id}`;
  const key = () => Object.keys(turnVectors).find((k) => turnVectors[k][0] === yaw && turnVectors[k][1] === 0);
  const release = () => {
    btn.classList.remove("active");
    if (app.current && !app.current.closing) releaseCode(app.current, code);
  };
  btn.addEventListener("pointerdown", (ev) => {
    const k = key();
    if (!sessionActive() || !k) return;
    ev.preventDefault();
    btn.setPointerCapture(ev.pointerId);
    btn.classList.add("active");
    holdKey(app.current, code, k);
  });
  btn.addEventListener("pointerup", release);
  btn.addEventListener("pointercancel", release);
  // Keyboard and switch users: Enter/Space on the focused button turns while held.
  btn.addEventListener("keydown", (ev) => {
    const k = key();
    if ((ev.key === "Enter" || ev.key === " ") && sessionActive() && k && !ev.repeat) {
      ev.preventDefault();
      ev.stopPropagation();
      holdKey(app.current, code, k);
    }
  });
  btn.addEventListener("keyup", (ev) => {
    if (ev.key === "Enter" || ev.key === " ") release();
  });
}

// A finger dragged on the video looks around (mouse users get pointer lock instead).
function wireTouchLook() {
  let last = null; // {id, x, y}
  el.videoBox.addEventListener("pointerdown", (ev) => {
    if (ev.pointerType === "touch") useTouchUi(true);
    if (ev.pointerType !== "touch" || last || ev.target.closest(".touch-controls, button")) return;
    last = { id: ev.pointerId, x: ev.clientX, y: ev.clientY };
  });
  el.videoBox.addEventListener("pointermove", (ev) => {
    const s = app.current;
    if (!last || ev.pointerId !== last.id || !s || s.closing) return;
    s.look.dx += TOUCH_LOOK_GAIN * (ev.clientX - last.x);
    s.look.dy += TOUCH_LOOK_GAIN * (ev.clientY - last.y);
    last = { id: ev.pointerId, x: ev.clientX, y: ev.clientY };
  });
  const end = (ev) => {
    if (last && ev.pointerId === last.id) last = null;
  };
  el.videoBox.addEventListener("pointerup", end);
  el.videoBox.addEventListener("pointercancel", end);
}

function releaseAll() {
  // Keyups (and pointerups) are not delivered once the window loses focus; without this, keys would stick.
  const s = app.current;
  if (!s || s.closing) return;
  const hadKeys = s.heldCodes.size > 0;
  s.heldCodes.clear();
  const sent = send(s, { type: "control_state", controls: [] });
  if (hadKeys) probe(s, sent);
  renderHud();
}

// ---------------------------------------------------------------- mouse look

function lockPointer() {
  // A model without mouse look has no use for a captured pointer.
  if (hook.state !== "streaming" || document.pointerLockElement === el.videoBox || !lookAccepted()) return;
  try {
    const p = el.videoBox.requestPointerLock();
    if (p && p.catch) p.catch(() => {});
  } catch (_) { /* pointer lock unavailable (e.g. an iframe without permission) */ }
}

function onMouseMove(ev) {
  const s = app.current;
  if (document.pointerLockElement !== el.videoBox || !s || s.closing) return;
  s.look.dx += ev.movementX || 0;
  s.look.dy += ev.movementY || 0;
}

// Mouse deltas are summed and sent once per animation frame (at most ~30 per second).
function flushLook(s, now) {
  const look = s.look;
  if ((look.dx === 0 && look.dy === 0) || now - look.lastSent < LOOK_MIN_INTERVAL_MS) return;
  const clamp = (v) => Math.max(-maxLookPx, Math.min(maxLookPx, v));
  if (send(s, { type: "look", dx: clamp(look.dx), dy: clamp(look.dy) })) {
    look.dx = 0;
    look.dy = 0;
    look.lastSent = now;
  }
}

// Runs for the life of s; teardown (session.js) cancels s.rafHandle.
export function startLookLoop(s) {
  s.rafHandle = requestAnimationFrame(function tick(now) {
    if (s !== app.current || s.closing) return;
    flushLook(s, now);
    s.rafHandle = requestAnimationFrame(tick);
  });
}

// ---------------------------------------------------------------- wiring

// `save`: what key P does (the Save button's action).
export function wireControls({ save } = {}) {
  if (save) saveSnapshot = save;
  el.videoBox.addEventListener("click", (ev) => {
    if (ev.target.closest("button, .touch-controls") || hook.touchUi) return;
    lockPointer();
  });
  wireStick();
  wireTurnButton(el.turnLeftBtn);
  wireTurnButton(el.turnRightBtn);
  el.resetBtn.addEventListener("click", () => {
    if (sessionActive()) resetPose(app.current);
  });
  wireTouchLook();
  el.lookBtn.addEventListener("click", lockPointer);
  document.addEventListener("pointerlockchange", () => {
    const locked = document.pointerLockElement === el.videoBox;
    el.videoBox.classList.toggle("locked", locked);
    el.lookBtn.hidden = locked || hook.state !== "streaming" || !lookAccepted();
  });
  document.addEventListener("mousemove", onMouseMove);
  window.addEventListener("keydown", onKeyDown);
  window.addEventListener("keyup", onKeyUp);
  window.addEventListener("blur", releaseAll);
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) releaseAll();
  });
  // Phones get the stick and buttons from the start; a touch on the video switches later (useTouchUi).
  hook.touchUi = touchScreen();
  document.body.classList.toggle("touch", hook.touchUi);
}
