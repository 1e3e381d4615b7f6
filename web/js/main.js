// worldrtc browser client: start a session, receive the generated world over WebRTC, steer it with
// keys, mouse or touch over the "control" data channel, and show what the stream is doing in a HUD
// (with a live stage timeline, key T). The driver can share a link that lets others watch the same
// world; the page opened with that link is a spectator's view: the video and the HUD, no controls.
// The driver can also save snapshots of the world (Save, key P), and branch a new session from one
// or rewind the live one to it.
// Plain ES modules, no build step, no external requests; the control keys and limits come from the
// server (GET /v1/model: `controls`, `limits`), so nothing here copies them.
//
// This entry module picks the page's view, loads the model description and wires the page's forms
// and buttons to the modules that do the work; the other modules only define things when they load,
// so everything the page does starts from here, in one order:
//   state.js     what the modules share: the live connection, the model, the test hook
//   dom.js       the page's elements
//   api.js       REST calls, their errors and the API token
//   peer.js      what a session and a watch share: the connection record, ICE, video, release
//   session.js   a session's life: create, offer/answer, data channels, reconnect, teardown
//   latency.js   frames, fps and glass-to-glass latency
//   controls.js  keys, mouse look and touch, and every message sent on the control channel
//   hud.js       the HUD's numbers, its stage timeline and the Controls help
//   status.js    the state, overlay, message line and buttons
//   scenes.js    the start image and the create body
//   downloads.js the last session's video and recording
//   link.js      the spectator link: the watch URL and token in the page's fragment
//   share.js     the driver's share control: the link, who watches, a new link
//   snapshots.js the driver's snapshots: Save, the strip of them, Branch, Rewind and delete
//   view.js      the driver's view or a spectator's
//   spectator.js a spectator's watch: join, the session's messages, why it ended, Leave

import { ApiError, api, describeApiError, readApiToken, storeApiToken } from "./api.js";
import { adoptControls, wireControls } from "./controls.js";
import { el } from "./dom.js";
import { wireDownloads } from "./downloads.js";
import { renderHud, renderKeyHelp, wireHud } from "./hud.js";
import { readSpectatorLink } from "./link.js";
import { adoptLimits, createBody, renderScenes, wireStartImage } from "./scenes.js";
import { restart, start, stop, teardown } from "./session.js";
import { wireShare } from "./share.js";
import { restoreStrip, save, wireSnapshots } from "./snapshots.js";
import { showEvents, wirePrompts } from "./prompts.js";
import { leave, leaveNow, watch, watchAgain } from "./spectator.js";
import { app, hook } from "./state.js";
import { setState, showMessage, showModel, updateControls } from "./status.js";
import { showSpectatorView } from "./view.js";

// ---------------------------------------------------------------- the model

let modelRetryTimer = null;

async function loadModel() {
  clearTimeout(modelRetryTimer);
  try {
    app.modelInfo = await api("GET", "/v1/model");
    adoptControls(app.modelInfo);
    adoptLimits(app.modelInfo);
    showEvents(app.modelInfo.events);
    restoreStrip(); // the saves of earlier visits, in the background
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      el.modelName.textContent = "this server needs an API token";
      el.tokenDetails.open = true;
      showMessage(`${describeApiError(err, "The server refused the request")} Enter the API token below.`, true);
      el.apiToken.focus();
      return; // retried when the token changes
    }
    const loading = err instanceof ApiError && (err.status === 503 || err.status === 0);
    el.modelName.textContent = loading ? "waiting for the server…" : "model unavailable";
    showMessage(`${describeApiError(err, "Could not load the model description")} Retrying…`, true);
    clearTimeout(modelRetryTimer);
    modelRetryTimer = setTimeout(loadModel, 2000);
    return;
  }
  const info = app.modelInfo;
  hook.model = info;
  showModel(info.model, info.weights);
  renderKeyHelp(info);
  showPromptField(info.takes_prompt !== false);
  renderScenes(info.scenes || []);
  showMessage("", false);
  updateControls();
}

// A model that conditions on the start image alone (Matrix-Game) reads no prompt: hide the field
// rather than let a typed prompt look as if it did something.
function showPromptField(takesPrompt) {
  el.prompt.closest(".field").hidden = !takesPrompt;
}

// The overlay button's fix for the error it shows (hook.action, set by setState).
function runAction() {
  const action = hook.action;
  if ((action === "reconnect" || action === "restart") && app.lastBody) {
    restart({ isReconnect: action === "reconnect" });
  } else if (action === "image") {
    el.imageInput.click(); // a click handler may open the file picker
  } else if (action === "scene") {
    loadModel().then(() => {
      const picked = el.scenes.querySelector(".scene[data-kind='scene'] input:checked");
      if (picked) picked.focus();
    });
  } else if (action === "token") {
    el.tokenDetails.open = true;
    el.apiToken.focus();
  }
}

// ---------------------------------------------------------------- wiring

function driverPage() {
  app.apiToken = readApiToken();
  el.form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const clickedAt = performance.now();
    let body;
    try {
      body = createBody();
    } catch (err) {
      showMessage(err.message, true);
      return;
    }
    start(body, clickedAt);
    el.videoBox.focus({ preventScroll: true }); // keys go to the world, not the form
    // On a phone the form sits below the video: bring the world (and its touch controls) into view.
    el.videoBox.scrollIntoView({ block: "nearest" });
  });
  el.stopBtn.addEventListener("click", stop);
  wireDownloads();
  wireShare();
  el.overlayBtn.addEventListener("click", runAction);
  wireStartImage();
  wireControls({ save });
  wireHud();
  wirePrompts();
  wireSnapshots();
  window.addEventListener("pagehide", () => {
    if (app.current && !app.current.closing) teardown(app.current, { sendStop: true });
  });

  el.apiToken.value = app.apiToken;
  el.apiToken.addEventListener("change", () => {
    app.apiToken = el.apiToken.value.trim();
    storeApiToken(app.apiToken);
    if (!app.modelInfo) loadModel();
  });
  setState("idle");
  loadModel();
}

// No session of its own, no model description (it may want the API token, which the link does not
// carry) and no keys: the page watches the linked session until it ends or Leave.
function spectatorPage(link) {
  showSpectatorView();
  el.leaveBtn.addEventListener("click", leave);
  el.overlayBtn.addEventListener("click", () => {
    if (hook.action === "watch") watchAgain();
  });
  window.addEventListener("pagehide", leaveNow);
  watch(link);
}

const spectatorLink = readSpectatorLink();
if (spectatorLink) spectatorPage(spectatorLink);
else driverPage();
// A spectator link pasted into this tab's address bar changes only the fragment: load what it asks for.
window.addEventListener("hashchange", () => {
  if (JSON.stringify(readSpectatorLink()) !== JSON.stringify(spectatorLink)) window.location.reload();
});
setInterval(renderHud, 250);
