// Where things stand, as the page says it: the session state (HUD cell, overlay and its button),
// the message under the form, the model line, and which buttons can be pressed. Every module that
// changes the state goes through setState, so the overlay, the buttons and the hook never disagree.

import { el } from "./dom.js";
import { renderHud } from "./hud.js";
import { app, hook, lookAccepted } from "./state.js";

// What the overlay's button says for each fix it offers (see FIX_FOR_CODE in session.js).
const ACTION_LABELS = {
  reconnect: "Reconnect",
  restart: "Start again",
  image: "Choose another image",
  scene: "Pick a scene",
  token: "Enter the API token",
  watch: "Watch again",
};

const STATE_TEXT = {
  idle: "idle", connecting: "connecting", waiting: "in line", streaming: "streaming", closed: "closed", error: "error",
};

export function showMessage(text, isError) {
  el.message.textContent = text;
  el.message.classList.toggle("error", Boolean(isError) && Boolean(text));
}

export function showModel(name, weights) {
  const info = app.modelInfo;
  const geo = info && info.width ? ` · ${info.width}×${info.height} @ ${info.fps} fps` : "";
  el.modelName.textContent = `${name || "unknown model"}${geo}`;
  if (weights) {
    el.weightsNote.hidden = false;
    el.weightsNote.textContent = weights;
    el.weightsNote.classList.toggle("random", /random/i.test(weights));
  } else {
    el.weightsNote.hidden = true;
  }
}

// `action` (closed and error states): what the overlay's button offers (ACTION_LABELS), or null.
export function setState(state, text, action = null) {
  hook.state = state;
  if (state !== "streaming") hook.turnEndsAt = null;
  el.hudState.textContent = STATE_TEXT[state] || state;
  el.hudState.dataset.state = state;
  el.videoBox.classList.toggle("streaming", state === "streaming");
  el.videoBox.dataset.state = state;
  const showOverlay = state !== "streaming";
  el.overlay.hidden = !showOverlay;
  el.overlay.classList.toggle("error", state === "error");
  if (text !== undefined && text !== "") el.overlayText.textContent = text;
  const restartable = action === "reconnect" || action === "restart";
  hook.action = (state === "error" || state === "closed") && action && (app.lastBody || !restartable) ? action : null;
  el.overlayBtn.hidden = hook.action === null;
  if (hook.action) el.overlayBtn.textContent = ACTION_LABELS[hook.action];
  const steers = hook.role === "driver"; // a spectator's view has nothing to steer with
  el.lookBtn.hidden = !steers || state !== "streaming" || document.pointerLockElement === el.videoBox ||
    hook.touchUi || !lookAccepted();
  el.touchControls.hidden = !(steers && hook.touchUi && state === "streaming");
  el.livePromptForm.hidden = !(steers && app.modelInfo && app.modelInfo.live_prompts);
  el.livePrompt.disabled = state !== "streaming";
  for (const chip of el.eventChips.children) chip.disabled = state !== "streaming";
  if (state !== "streaming") el.hudError.textContent = ""; // the overlay says what happened
  updateControls();
  renderHud();
}

export function updateControls() {
  const busy = hook.state === "connecting" || hook.state === "waiting" || hook.state === "streaming";
  el.startBtn.disabled = busy || !app.modelInfo || !app.choice;
  el.stopBtn.disabled = !busy;
  // A snapshot is taken at the next chunk boundary: only a session that streams has one coming.
  el.saveBtn.disabled = hook.state !== "streaming" || hook.saving;
  el.downloadVideoBtn.disabled = !app.recorded;
  el.downloadRecordingBtn.disabled = !app.recorded;
}
