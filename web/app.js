// worldrtc browser client: start a session, receive the generated world over WebRTC, steer it with
// keys, mouse or touch over the "control" data channel, and show what the stream is doing in a HUD
// (with a live stage timeline, key T).
// Plain JS, no build step, no external requests. Wire formats: server/protocol.py; the control keys and
// limits come from the server (GET /v1/model: `controls`, `limits`), so nothing here copies them.
"use strict";

(() => {
  // ---- client timings (the server's limits arrive with GET /v1/model) ----
  const PING_INTERVAL_MS = 1000; // for the HUD's round-trip time only: the server watches the connection
  const LOST_GRACE_MS = 3000; // pc "disconnected"/"failed" this long counts as a lost connection
  const ICE_GATHER_TIMEOUT_MS = 5000; // no trickle: wait for gathering, but not forever
  const CONNECT_TIMEOUT_MS = 20000; // answer applied → control channel open (the server's ICE limit is 15 s)
  const FIRST_FRAME_TIMEOUT_MS = 90000; // channel open → first frame: model compute, generous for big models
  const LOOK_MIN_INTERVAL_MS = 33; // ≤ 30 look messages/s, well under the 120 messages/s limit
  const RECONNECT_DELAYS_MS = [1000, 2000, 4000];
  const RECONNECT_RESET_AFTER_MS = 10000; // a session that streamed this long earns fresh reconnect attempts
  const G2G_WINDOW = 50;
  const FPS_WINDOW_MS = 2000;
  const MAX_PENDING_PROBES = 256;
  const MATCH_GIVE_UP_MS = 5000;
  const SHOWN_PTS_KEPT = 64; // 4 s at 16 FPS: longer than a chunk takes from first frame to message
  const VIDEO_CLOCK_HZ = 90000;
  const PTS_SLACK_FRAMES = 8; // pacer's extra 4 frames + jitter buffer and decode
  const MAX_SOURCE_BYTES = 64 * 1048576; // a start image file larger than this is refused before reading
  const TIMELINE_POLL_MS = 1000; // the HUD strip's refresh (GET …/timeline)
  const TIMELINE_WINDOW_S = 6; // seconds of the session the HUD strip shows
  const STICK_DEAD_ZONE = 0.3; // of the stick's radius: smaller drags move nothing
  const STICK_KEY_MIN_COS = 0.38; // a move key is held while the stick points within ~68° of it
  const TOUCH_LOOK_GAIN = 1.5; // look pixels per CSS pixel of finger travel on the video

  const RESET_CODE = "KeyR";
  const TIMELINE_CODE = "KeyT";

  // Physical key (event.code, layout independent, lower-cased) → the camera key the server
  // understands, and the server's limits: both from GET /v1/model.
  let keyMap = {};
  let moveVectors = {}; // move key → [right, forward]
  let turnVectors = {}; // turn key → [yaw right, pitch up]
  let maxLookPx = 0;
  let maxImageBytes = 0;
  let modelSize = { width: 0, height: 0 };

  function adoptContract(info) {
    const c = info.controls;
    keyMap = {};
    for (const k of [...c.move_keys, ...c.turn_keys]) keyMap[`key${k}`] = k;
    Object.assign(keyMap, c.key_aliases); // e.g. arrowup → w
    moveVectors = c.move_vectors || {};
    turnVectors = c.turn_vectors || {};
    maxLookPx = c.max_look_px;
    maxImageBytes = info.limits.image_max_bytes;
    modelSize = { width: info.width, height: info.height };
  }

  const $ = (id) => document.getElementById(id);
  const el = {
    modelName: $("model-name"),
    weightsNote: $("weights-note"),
    video: $("video"),
    videoBox: $("video-box"),
    overlay: $("overlay"),
    overlayText: $("overlay-text"),
    overlayBtn: $("overlay-btn"),
    lookBtn: $("look-btn"),
    hudState: $("hud-state"),
    hudFps: $("hud-fps"),
    hudChunkPeriod: $("hud-chunk-period"),
    hudLatency: $("hud-latency"),
    hudFirstFrame: $("hud-first-frame"),
    hudDrops: $("hud-drops"),
    hudPredicted: $("hud-predicted"),
    hudBuffered: $("hud-buffered"),
    hudRepeats: $("hud-repeats"),
    hudRtt: $("hud-rtt"),
    hudKeys: $("hud-keys"),
    hudError: $("hud-error"),
    hudStrip: $("hud-strip"),
    hudTimeline: $("hud-timeline"),
    timelineBtn: $("timeline-btn"),
    keyHelp: $("key-help"),
    controlsHelp: $("controls-help"),
    touchControls: $("touch-controls"),
    stick: $("stick"),
    stickKnob: $("stick-knob"),
    turnLeftBtn: $("turn-left-btn"),
    turnRightBtn: $("turn-right-btn"),
    resetBtn: $("reset-btn"),
    form: $("start-form"),
    scenes: $("scenes"),
    scenesEmpty: $("scenes-empty"),
    imageInput: $("image-input"),
    prompt: $("prompt"),
    seed: $("seed"),
    startBtn: $("start-btn"),
    stopBtn: $("stop-btn"),
    downloadVideoBtn: $("download-video-btn"),
    downloadRecordingBtn: $("download-recording-btn"),
    message: $("message"),
    panel: document.querySelector(".panel"),
    tokenDetails: $("token-details"),
    apiToken: $("api-token"),
  };

  // ---- test hook: read by tests/web/test_browser.py, updated live ----
  const hook = {
    state: "idle", // idle | connecting | streaming | closed | error
    sessionId: null,
    error: null,
    errorCode: null, // the server's code of the error shown (e.g. bad_image), null for client-side ones
    action: null, // what the overlay button offers: reconnect | image | scene | token | null
    model: null,
    lastSeq: {}, // message type → seq of the last one sent (a chunk's applied_seq ≥ it: applied)
    timeline: null, // the last GET …/timeline the HUD strip drew
    touchUi: false,
    stats: {
      framesDisplayed: 0,
      fps: 0,
      firstFrameS: null,
      g2gP50Ms: null,
      g2gLastMs: null,
      g2gSamples: 0,
      g2gMethod: null, // "rtp-pts" or "next-frame" (see the latency comment below)
      g2gLog: [],
      chunksReceived: 0,
      lastChunk: null,
      serverStats: null,
      rttMs: null,
    },
  };
  window.worldrtc = hook;

  let modelInfo = null; // GET /v1/model
  let recorded = null; // { url, token, id } of the last session created: what the download buttons fetch
  let choice = null; // {scene: name} | {image: dataUrl, name}
  let current = null; // the live session (see newSession)
  let lastBody = null; // the create body of the last session, for reconnects
  let reconnectAttempt = 0;
  let reconnectTimer = null;
  // A server bound beyond loopback wants an API token on its REST routes. It comes from the form or
  // from the page address (#token=…, removed from the address bar at once) and lives in sessionStorage.
  let apiToken = readApiToken();

  function readApiToken() {
    const m = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
    if (m) {
      const token = decodeURIComponent(m[1]);
      try {
        sessionStorage.setItem("worldrtc.apiToken", token);
      } catch (_) { /* storage disabled: keep it for this page only */ }
      history.replaceState(null, "", window.location.pathname + window.location.search);
      return token;
    }
    try {
      return sessionStorage.getItem("worldrtc.apiToken") || "";
    } catch (_) {
      return "";
    }
  }

  // ---------------------------------------------------------------- REST

  class ApiError extends Error {
    constructor(status, code, message, retryAfterS) {
      super(message);
      this.status = status;
      this.code = code;
      this.retryAfterS = retryAfterS;
    }
  }

  async function api(method, path, body, token) {
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (token || apiToken) headers.Authorization = `Bearer ${token || apiToken}`;
    let resp;
    try {
      resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (err) {
      throw new ApiError(0, "network", "Cannot reach the server. Is it running, and is this the right address?");
    }
    const text = await resp.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!resp.ok) {
      const retry = Number.parseFloat(resp.headers.get("Retry-After") || "");
      let message = (data && (data.message || (typeof data.detail === "string" ? data.detail : null))) || "";
      if (!message && data && Array.isArray(data.detail)) message = data.detail.map((d) => d.msg).join("; ");
      if (!message) message = `${resp.status} ${resp.statusText || "error"}`;
      throw new ApiError(resp.status, (data && data.error) || `http_${resp.status}`, message,
        Number.isFinite(retry) ? retry : null);
    }
    return data;
  }

  const sentence = (text) => {
    const t = String(text || "").trim();
    return !t || /[.!?…]$/.test(t) ? t : `${t}.`;
  };

  // What a person can do about an error the server reports by code (server/errors.py): permanent
  // errors offer a fix on the overlay's button; transient ones (busy, not ready, no network) are
  // retried with backoff instead.
  const FIX_FOR_CODE = { bad_image: "image", too_large: "image", unknown_scene: "scene", unauthorized: "token" };
  const ACTION_LABELS = {
    reconnect: "Reconnect",
    restart: "Start again",
    image: "Choose another image",
    scene: "Pick a scene",
    token: "Enter the API token",
  };

  function transient(err) {
    return err instanceof ApiError && (err.status === 0 || err.status === 429 || err.status === 503);
  }

  function describeApiError(err, doing) {
    if (!(err instanceof ApiError)) return sentence(`${doing}: ${err && err.message ? err.message : err}`);
    let text = sentence(`${doing}: ${err.message}`);
    // Busy and not ready are retried by the caller, which says when (honouring Retry-After).
    if (err.status === 429) {
      text = `The server is busy: ${sentence(err.message)}`;
    } else if (err.status === 503) {
      text = `The server is not ready yet: ${sentence(err.message)}`;
    } else if (err.status === 401 || err.status === 403) {
      text = sentence(`${doing}: not allowed (${err.message})`);
    }
    return text;
  }

  // ---------------------------------------------------------------- model + start image

  let modelRetryTimer = null;

  async function loadModel() {
    clearTimeout(modelRetryTimer);
    try {
      modelInfo = await api("GET", "/v1/model");
      adoptContract(modelInfo);
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
    hook.model = modelInfo;
    showModel(modelInfo.model, modelInfo.weights);
    renderKeyHelp(modelInfo);
    showPromptField(modelInfo.takes_prompt !== false);
    renderScenes(modelInfo.scenes || []);
    showMessage("", false);
    updateControls();
  }

  function showModel(name, weights) {
    const geo = modelInfo && modelInfo.width ? ` · ${modelInfo.width}×${modelInfo.height} @ ${modelInfo.fps} fps` : "";
    el.modelName.textContent = `${name || "unknown model"}${geo}`;
    if (weights) {
      el.weightsNote.hidden = false;
      el.weightsNote.textContent = weights;
      el.weightsNote.classList.toggle("random", /random/i.test(weights));
    } else {
      el.weightsNote.hidden = true;
    }
  }

  // A model that conditions on the start image alone (Matrix-Game) reads no prompt: hide the field
  // rather than let a typed prompt look as if it did something.
  function showPromptField(takesPrompt) {
    el.prompt.closest(".field").hidden = !takesPrompt;
  }

  // ---- the Controls help: only what this model steers by (GET /v1/model `accepts`) ----
  //
  // Models differ: the camera ones take W A S D, I J K L and the mouse, a Temple Run one jumps on W
  // and has no mouse look. Other keys still reach the server, which ignores them, so the help lists
  // only the accepted ones. The R and T lines are the page's and the server's own, whatever the model.

  const ALIAS_NAMES = { // browser key alias → [key cap, spoken name]
    arrowup: ["\u2191", "up arrow"],
    arrowdown: ["\u2193", "down arrow"],
    arrowleft: ["\u2190", "left arrow"],
    arrowright: ["\u2192", "right arrow"],
  };

  // True until the server says otherwise: the static help (and an older server) offer the mouse.
  function lookAccepted() {
    const accepts = modelInfo && modelInfo.accepts;
    return !accepts || accepts.look !== false;
  }

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

  const staticVideoLabel = el.videoBox.getAttribute("aria-label");

  function renderKeyHelp(info) {
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
    spoken.push("R resets the camera", "T shows the stage timeline");
    el.videoBox.setAttribute("aria-label", `Generated world. While it streams: ${spoken.join(", ")}.`);
  }

  function renderScenes(scenes) {
    el.scenes.querySelectorAll(".scene[data-kind='scene']").forEach((n) => n.remove());
    el.scenesEmpty.hidden = scenes.length > 0;
    el.scenesEmpty.textContent = scenes.length ? "" : "No built-in scenes; upload an image.";
    scenes.forEach((scene, i) => {
      const item = sceneItem("scene", scene.name, scene.url, scene.name);
      item.dataset.index = String(i);
      el.scenes.appendChild(item);
    });
    if (!choice && scenes.length) selectScene(scenes[0].name);
  }

  function sceneItem(kind, value, src, label) {
    const wrap = document.createElement("label");
    wrap.className = "scene";
    wrap.dataset.kind = kind;
    wrap.dataset.name = value;
    const input = document.createElement("input");
    input.type = "radio";
    input.name = "scene";
    input.value = value;
    input.addEventListener("change", () => {
      if (!input.checked) return;
      if (kind === "scene") choice = { scene: value };
      else choice = { image: wrap.dataset.dataUrl, name: label };
      updateControls();
    });
    const img = document.createElement("img");
    if (apiToken && kind === "scene") {
      // <img> cannot send an Authorization header; fetch the thumbnail and show it from a blob.
      fetch(src, { headers: { Authorization: `Bearer ${apiToken}` } })
        .then((r) => (r.ok ? r.blob() : null))
        .then((blob) => {
          if (blob) img.src = URL.createObjectURL(blob);
        })
        .catch(() => {});
    } else {
      img.src = src;
    }
    img.alt = "";
    img.loading = "lazy";
    img.decoding = "async";
    const span = document.createElement("span");
    span.textContent = label;
    wrap.append(input, img, span);
    return wrap;
  }

  function selectScene(name) {
    const input = el.scenes.querySelector(`.scene[data-kind='scene'] input[value="${CSS.escape(name)}"]`);
    if (input) {
      input.checked = true;
      choice = { scene: name };
    }
  }

  // The server crops and resizes a start image to the model's resolution, so pixels beyond twice
  // that only cost upload time (and meet the size limit sooner): big images are scaled down here.
  async function startImageDataUrl(file) {
    const bitmap = await createImageBitmap(file);
    const scale = Math.min(1, Math.max((2 * modelSize.width) / bitmap.width, (2 * modelSize.height) / bitmap.height));
    if (scale === 1 && file.size <= maxImageBytes) {
      bitmap.close();
      return await new Promise((resolve, reject) => {
        const reader = new FileReader();
        reader.onerror = () => reject(reader.error);
        reader.onload = () => resolve(String(reader.result));
        reader.readAsDataURL(file);
      });
    }
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, Math.round(bitmap.width * scale));
    canvas.height = Math.max(1, Math.round(bitmap.height * scale));
    canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    bitmap.close();
    return canvas.toDataURL("image/jpeg", 0.92);
  }

  const mib = (n) => (n / 1048576).toFixed(1);

  // Type and size are checked before the file is read, and the image is decoded here before it is
  // offered: a file the browser cannot decode never becomes a (broken) thumbnail or an upload.
  async function readImage(file) {
    if (!file) return;
    if (!/^image\/(png|jpeg)$/.test(file.type)) {
      showMessage(`"${file.name}" is not a PNG or JPEG image. Choose a .png or .jpg file.`, true);
      return;
    }
    if (file.size > MAX_SOURCE_BYTES) {
      showMessage(`"${file.name}" is ${mib(file.size)} MiB; choose an image under ${mib(MAX_SOURCE_BYTES)} MiB.`, true);
      return;
    }
    let dataUrl;
    try {
      dataUrl = await startImageDataUrl(file);
    } catch (_) {
      showMessage(`"${file.name}" could not be read as an image: it may be damaged, or not really a PNG or JPEG. ` +
        "Choose another file.", true);
      return;
    }
    const bytes = Math.floor((dataUrl.length - dataUrl.indexOf(",") - 1) * 0.75);
    if (bytes > maxImageBytes) {
      showMessage(`"${file.name}" is ${mib(bytes)} MiB even scaled down; the limit is ${mib(maxImageBytes)} MiB. ` +
        "Choose a smaller image.", true);
      return;
    }
    let item = el.scenes.querySelector(".scene[data-kind='image']");
    if (item) item.remove();
    item = sceneItem("image", "__upload__", dataUrl, file.name);
    item.dataset.dataUrl = dataUrl;
    el.scenes.prepend(item);
    const input = item.querySelector("input");
    input.checked = true;
    choice = { image: dataUrl, name: file.name };
    showMessage(`Using "${file.name}" as the start image.`, false);
    updateControls();
  }

  function createBody() {
    const seed = Number(el.seed.value || "0");
    if (!Number.isInteger(seed) || seed < 0 || seed > 2147483647) {
      throw new Error("The seed must be a whole number from 0 to 2147483647.");
    }
    const body = { prompt: el.prompt.value.trim(), seed };
    if (choice && choice.image) body.image = choice.image;
    else if (choice && choice.scene) body.scene = choice.scene;
    else throw new Error("Pick a start scene or upload an image first.");
    return body;
  }

  // ---------------------------------------------------------------- session lifecycle

  function newSession(body, startedAt) {
    return {
      body,
      startedAt, // performance.now() of the Start click (first-frame time counts from here)
      id: null,
      url: null, // the session's REST resource, on the node that holds it (set with id)
      token: null,
      pc: null,
      dc: null,
      seq: 0,
      closing: false,
      done: null, // reason from the server's "done"
      failed: null, // message of a session_failed error that came before "done"
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

  function resetStats() {
    Object.assign(hook.stats, {
      framesDisplayed: 0, fps: 0, firstFrameS: null,
      g2gP50Ms: null, g2gLastMs: null, g2gSamples: 0, g2gMethod: null, g2gLog: [],
      chunksReceived: 0, lastChunk: null, serverStats: null, rttMs: null, ptsAheadFrames: null,
    });
    hook.error = null;
    el.hudError.textContent = "";
  }

  async function start(body, startedAt, { isReconnect = false } = {}) {
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    if (current) teardown(current, { sendStop: true });
    const s = newSession(body, startedAt);
    current = s;
    lastBody = body;
    if (!isReconnect) reconnectAttempt = 0;
    resetStats();
    setState("connecting", isReconnect ? "Reconnecting: starting a new session…" : "Starting a session…");
    showMessage("", false);

    try {
      const created = await api("POST", "/v1/sessions", body);
      s.id = created.session_id;
      // Behind a balancer the session lives on one node: its routes are the URLs the create returned.
      s.url = created.session_url || `/v1/sessions/${encodeURIComponent(s.id)}`;
      s.token = created.token || null;
      recorded = { url: s.url, token: s.token, id: s.id };
      updateControls();
      if (!alive(s)) {
        deleteSession(s); // stopped while the create request was in flight
        return;
      }
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
      armFirstFrameTimer(s, CONNECT_TIMEOUT_MS, "No connection within 20 s. The network may block WebRTC " +
        "(UDP), or the server may need a TURN server (GET /v1/ice-servers).");
      startFrameWatch(s);
    } catch (err) {
      if (!alive(s)) return;
      const text = describeApiError(err, "Could not start the session");
      if (transient(err)) {
        fail(s, text, { retry: true, code: err.code, retryAfterS: err.retryAfterS });
        return;
      }
      const code = err instanceof ApiError ? err.code : null;
      if (code === "unknown_scene") choice = null; // the list is stale: the fix reloads it
      fail(s, text, { retry: false, code, action: FIX_FOR_CODE[code] || "reconnect" });
    }
  }

  function armFirstFrameTimer(s, ms, text) {
    clearTimeout(s.timers.firstFrame);
    s.timers.firstFrame = setTimeout(function check() {
      if (!alive(s) || s.firstFrameAt !== null) return;
      // Hidden tabs present no frames, so the wait only counts while the page is visible.
      if (document.hidden) s.timers.firstFrame = setTimeout(check, 1000);
      else fail(s, text, { retry: false });
    }, ms);
  }

  function alive(s) {
    return s === current && !s.closing;
  }

  async function getIceServers() {
    try {
      const data = await api("GET", "/v1/ice-servers");
      return Array.isArray(data && data.ice_servers) ? data.ice_servers : [];
    } catch (_) {
      return []; // loopback and LAN work without STUN/TURN
    }
  }

  function waitIceGathering(pc, timeoutMs) {
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

  function wirePeer(s, pc) {
    pc.ontrack = (ev) => {
      if (s !== current) return;
      const stream = ev.streams && ev.streams[0] ? ev.streams[0] : new MediaStream([ev.track]);
      el.video.srcObject = stream;
      const p = el.video.play();
      if (p && p.catch) p.catch(() => {}); // muted autoplay is allowed; ignore interrupted play()
    };
    pc.ondatachannel = (ev) => wireChannel(s, ev.channel, false); // a server-opened "status" channel
    pc.onconnectionstatechange = () => {
      if (s !== current || s.closing) return;
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

  function wireChannel(s, ch, isControl) {
    ch.onmessage = (ev) => {
      if (s !== current) return;
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (_) {
        return;
      }
      onServerMessage(s, msg);
    };
    if (!isControl) return;
    ch.onopen = () => {
      if (s !== current) return;
      armFirstFrameTimer(s, FIRST_FRAME_TIMEOUT_MS, "Connected, but the server sent no video within 90 s.");
      // Keys pressed while connecting are sent as one state; then a ping every second for the RTT.
      send(s, { type: "control_state", controls: heldKeys(s) });
      s.timers.ping = setInterval(() => send(s, { type: "ping" }), PING_INTERVAL_MS);
    };
    ch.onclose = () => {
      if (s !== current || s.closing) return;
      if (s.done !== null) finish(s, s.done);
      else lost(s, "The control channel closed unexpectedly.");
    };
  }

  function send(s, msg) {
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

  // The server may close a session on its own (done), or the network may drop it (lost).
  function finish(s, reason) {
    if (s !== current) return;
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
    if (s !== current || s.closing) return;
    const streamedLong = s.firstFrameAt !== null && performance.now() - s.firstFrameAt > RECONNECT_RESET_AFTER_MS;
    if (streamedLong) reconnectAttempt = 0;
    fail(s, text, { retry: s.firstFrameAt !== null });
  }

  // One place for a session's error: the overlay, with the button that can help (see FIX_FOR_CODE).
  function fail(s, text, { retry, code = null, action = "reconnect", retryAfterS = null }) {
    if (s !== current) return;
    teardown(s, { sendStop: true });
    hook.error = text;
    hook.errorCode = code;
    if (retry && reconnectAttempt < RECONNECT_DELAYS_MS.length) {
      const delay = Math.max(RECONNECT_DELAYS_MS[reconnectAttempt++], 1000 * (retryAfterS || 0));
      reconnectTimer = setTimeout(() => {
        reconnectTimer = null;
        if (current === s && lastBody) start(lastBody, performance.now(), { isReconnect: true });
      }, delay);
      setState("error", `${text} Trying again in ${Math.round(delay / 1000)} s (new session)…`, null);
    } else {
      setState("error", text, action);
    }
  }

  function stop() {
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    const s = current;
    if (!s) return;
    teardown(s, { sendStop: true });
    setState("closed", "Stopped. Press Start to begin again.", null);
  }

  // Idempotent; leaves `current` pointing at s so late events from it are recognised and ignored.
  function teardown(s, { sendStop }) {
    if (s.closing) return;
    if (sendStop) send(s, { type: "stop" });
    s.closing = true;
    for (const k of Object.keys(s.timers)) {
      clearTimeout(s.timers[k]);
      clearInterval(s.timers[k]);
      s.timers[k] = null;
    }
    if (s.rvfcHandle !== null && el.video.cancelVideoFrameCallback) el.video.cancelVideoFrameCallback(s.rvfcHandle);
    if (s.rafHandle !== null) cancelAnimationFrame(s.rafHandle);
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
    el.video.srcObject = null;
    if (document.pointerLockElement) document.exitPointerLock();
    deleteSession(s);
  }

  function deleteSession(s) {
    if (!s.id || s.deleted) return;
    s.deleted = true;
    const headers = s.token ? { Authorization: `Bearer ${s.token}` } : {};
    // keepalive lets the DELETE finish while the page unloads; 404 (already gone) is fine.
    fetch(s.url, { method: "DELETE", headers, keepalive: true }).catch(() => {});
  }

  // ---------------------------------------------------------------- server messages

  function onServerMessage(s, msg) {
    switch (msg.type) {
      case "ready":
        if (modelInfo) Object.assign(modelInfo, { width: msg.width, height: msg.height, fps: msg.fps });
        showModel(msg.model, msg.weights || (modelInfo && modelInfo.weights));
        break;
      case "chunk":
        onChunk(s, msg);
        break;
      case "stats":
        hook.stats.serverStats = msg;
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
      case "done":
        s.done = msg.reason || "done";
        finish(s, s.done);
        break;
      default:
        break;
    }
  }

  // The server's pacer holds at most about one chunk (+4 frames), so a chunk's first frame goes out
  // within that many frames of the one on screen when its message arrives. A pts_start further ahead
  // is not on the RTP clock (a server that counts pts by frame index drifts by dropped − repeated).
  // The chunk message comes when the chunk is done, which can be after its first frames were shown
  // (frames stream out as they are decoded): a pts_start up to a chunk behind is plausible too.
  function ptsPlausible(s, ptsStart, numFrames) {
    const fps = (modelInfo && modelInfo.fps) || 16;
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

  function onChunk(s, msg) {
    const now = performance.now();
    hook.stats.chunksReceived += 1;
    hook.stats.lastChunk = msg;
    s.chunkArrivals.push(now);
    if (s.chunkArrivals.length > 21) s.chunkArrivals.shift();
    const applied = msg.applied_seq;
    if (typeof applied === "number") {
      let ptsStart = typeof msg.pts_start === "number" ? msg.pts_start : null;
      if (ptsStart !== null && s.lastPts !== null && !ptsPlausible(s, ptsStart, msg.num_frames)) {
        s.ptsImplausible += 1;
        ptsStart = null; // not on the wire's clock: fall back to the next presented frame
      }
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
      for (const m of s.matched) recordLatency(s, now - m.sentAt);
      s.matched = [];
      hook.stats.g2gMethod = "chunk-arrival";
    }
  }

  // ---------------------------------------------------------------- frames, fps, glass-to-glass
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

  function videoFrameCallbacks() {
    return typeof el.video.requestVideoFrameCallback === "function";
  }

  function startFrameWatch(s) {
    if (videoFrameCallbacks()) {
      const onFrame = (now, meta) => {
        if (s !== current || s.closing) return;
        const shown = meta && typeof meta.expectedDisplayTime === "number" ? meta.expectedDisplayTime : now;
        let frames = 1;
        if (meta && typeof meta.presentedFrames === "number") {
          if (s.lastPresented !== null) frames = Math.max(1, meta.presentedFrames - s.lastPresented);
          s.lastPresented = meta.presentedFrames;
        }
        onFramesShown(s, shown, frames, framePts(s, meta));
        s.rvfcHandle = el.video.requestVideoFrameCallback(onFrame);
      };
      s.rvfcHandle = el.video.requestVideoFrameCallback(onFrame);
    } else {
      // Fallback: decoded-frame counts from getStats, twice a second.
      s.timers.stats = setInterval(async () => {
        if (s !== current || s.closing || !s.pc) return;
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
        if (decoded === null || s !== current) return;
        const prev = s.statsBase === null ? 0 : s.statsBase;
        s.statsBase = decoded;
        if (decoded > prev) onFramesShown(s, performance.now(), decoded - prev);
      }, 500);
    }
    s.rafHandle = requestAnimationFrame(function tick(now) {
      if (s !== current || s.closing) return;
      flushLook(s, now);
      s.rafHandle = requestAnimationFrame(tick);
    });
  }

  // The presented frame's pts on the server's 90 kHz clock, or null when the browser does not say.
  function framePts(s, meta) {
    if (!meta || typeof meta.rtpTimestamp !== "number") return null;
    if (s.rtpOrigin === null) {
      // The session's first frame has pts 0; if frames were presented before this callback, step back.
      const fps = (modelInfo && modelInfo.fps) || 16;
      const before = typeof meta.presentedFrames === "number" ? Math.max(0, Math.min(meta.presentedFrames - 1, 64)) : 0;
      s.rtpOrigin = (meta.rtpTimestamp - before * Math.round(VIDEO_CLOCK_HZ / fps)) >>> 0;
    }
    return (meta.rtpTimestamp - s.rtpOrigin) >>> 0; // uint32 RTP clock wraps after ~13 h
  }

  function onFramesShown(s, at, frames, pts = null) {
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
      setState("streaming", "");
    }
    if (s.matched.length) {
      s.matched = s.matched.filter((m) => {
        if (m.nextFrameAt === undefined) m.nextFrameAt = at;
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

  function recordLatency(s, ms) {
    s.g2g.push(ms);
    if (s.g2g.length > G2G_WINDOW) s.g2g.shift();
    hook.stats.g2gLastMs = ms;
    hook.stats.g2gSamples += 1;
    hook.stats.g2gP50Ms = percentile(s.g2g, 0.5);
  }

  function percentile(values, q) {
    if (!values.length) return null;
    const sorted = [...values].sort((a, b) => a - b);
    const pos = (sorted.length - 1) * q;
    const lo = Math.floor(pos);
    const hi = Math.ceil(pos);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
  }

  function currentFps(s, now) {
    const ft = s.frameTimes;
    if (ft.length < 2 || now - ft[ft.length - 1][0] > 1000) return 0;
    const span = ft[ft.length - 1][0] - ft[0][0];
    if (span < 250) return 0;
    let frames = 0;
    for (let i = 1; i < ft.length; i++) frames += ft[i][1];
    return (frames * 1000) / span;
  }

  // ---------------------------------------------------------------- keys and mouse

  function heldKeys(s) {
    return [...new Set(s.heldCodes.values())].sort();
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
    return current && !current.closing && (hook.state === "connecting" || hook.state === "streaming");
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
    const s = current;
    const code = ev.code || "";
    if (code === RESET_CODE || (!code && ev.key && ev.key.toLowerCase() === "r")) {
      ev.preventDefault();
      if (!ev.repeat) resetPose(s);
      return;
    }
    const key = keyMap[code.toLowerCase()] || keyMap[`key${(ev.key || "").toLowerCase()}`];
    if (!key) return;
    ev.preventDefault(); // no page scrolling on arrows
    if (!ev.repeat) holdKey(s, code, key);
  }

  function onKeyUp(ev) {
    if (!current || current.closing) return;
    if (current.heldCodes.has(ev.code || "")) {
      ev.preventDefault();
      releaseCode(current, ev.code || "");
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
      if (sessionActive()) holdStickKeys(current, stickKeys(dx, dy));
    };
    const end = (ev) => {
      if (ev.pointerId !== pointer) return;
      pointer = null;
      el.stickKnob.style.transform = "";
      el.stick.classList.remove("active");
      if (current && !current.closing) holdStickKeys(current, []);
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
      if (current && !current.closing) releaseCode(current, code);
    };
    btn.addEventListener("pointerdown", (ev) => {
      const k = key();
      if (!sessionActive() || !k) return;
      ev.preventDefault();
      btn.setPointerCapture(ev.pointerId);
      btn.classList.add("active");
      holdKey(current, code, k);
    });
    btn.addEventListener("pointerup", release);
    btn.addEventListener("pointercancel", release);
    // Keyboard and switch users: Enter/Space on the focused button turns while held.
    btn.addEventListener("keydown", (ev) => {
      const k = key();
      if ((ev.key === "Enter" || ev.key === " ") && sessionActive() && k && !ev.repeat) {
        ev.preventDefault();
        ev.stopPropagation();
        holdKey(current, code, k);
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
      if (!last || ev.pointerId !== last.id || !current || current.closing) return;
      current.look.dx += TOUCH_LOOK_GAIN * (ev.clientX - last.x);
      current.look.dy += TOUCH_LOOK_GAIN * (ev.clientY - last.y);
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
    if (!current || current.closing) return;
    const hadKeys = current.heldCodes.size > 0;
    current.heldCodes.clear();
    const sent = send(current, { type: "control_state", controls: [] });
    if (hadKeys) probe(current, sent);
    renderHud();
  }

  function lockPointer() {
    // A model without mouse look has no use for a captured pointer.
    if (hook.state !== "streaming" || document.pointerLockElement === el.videoBox || !lookAccepted()) return;
    try {
      const p = el.videoBox.requestPointerLock();
      if (p && p.catch) p.catch(() => {});
    } catch (_) { /* pointer lock unavailable (e.g. an iframe without permission) */ }
  }

  function onMouseMove(ev) {
    if (document.pointerLockElement !== el.videoBox || !current || current.closing) return;
    current.look.dx += ev.movementX || 0;
    current.look.dy += ev.movementY || 0;
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

  // ---------------------------------------------------------------- the HUD's stage timeline
  //
  // A strip in the HUD (key T, or the button under the controls): the last few seconds of the
  // session's GET …/timeline, drawn as benchmarks/timeline.py draws a whole run: a lane per stage
  // (and rank) with a bar per chunk, the pacer's buffer level, and a red tick per repeated frame.

  const LANE_COLOURS = { encode: "#4c78a8", dit: "#f58518", decode: "#54a24b" };
  let timelineTimer = null;

  function toggleTimeline() {
    const on = el.hudStrip.hidden;
    el.hudStrip.hidden = !on;
    el.timelineBtn.setAttribute("aria-pressed", String(on));
    el.timelineBtn.textContent = on ? "Hide the stage timeline" : "Show the stage timeline";
    clearInterval(timelineTimer);
    timelineTimer = on ? setInterval(pollTimeline, TIMELINE_POLL_MS) : null;
    if (on) pollTimeline();
  }

  async function pollTimeline() {
    const s = current;
    if (!s || s.closing || !s.id || hook.state !== "streaming") return;
    const url = `${s.url}/timeline?window_s=${TIMELINE_WINDOW_S}`;
    try {
      const report = await api("GET", url, undefined, s.token);
      if (s !== current || el.hudStrip.hidden) return;
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

  // ---------------------------------------------------------------- UI

  function showMessage(text, isError) {
    el.message.textContent = text;
    el.message.classList.toggle("error", Boolean(isError) && Boolean(text));
  }

  const STATE_TEXT = { idle: "idle", connecting: "connecting", streaming: "streaming", closed: "closed", error: "error" };

  // `action` (closed and error states): what the overlay's button offers (ACTION_LABELS), or null.
  function setState(state, text, action = null) {
    hook.state = state;
    el.hudState.textContent = STATE_TEXT[state] || state;
    el.hudState.dataset.state = state;
    el.videoBox.classList.toggle("streaming", state === "streaming");
    el.videoBox.dataset.state = state;
    const showOverlay = state !== "streaming";
    el.overlay.hidden = !showOverlay;
    el.overlay.classList.toggle("error", state === "error");
    if (text !== undefined && text !== "") el.overlayText.textContent = text;
    const restartable = action === "reconnect" || action === "restart";
    hook.action = (state === "error" || state === "closed") && action && (lastBody || !restartable) ? action : null;
    el.overlayBtn.hidden = hook.action === null;
    if (hook.action) el.overlayBtn.textContent = ACTION_LABELS[hook.action];
    el.lookBtn.hidden = state !== "streaming" || document.pointerLockElement === el.videoBox || hook.touchUi ||
      !lookAccepted();
    el.touchControls.hidden = !(hook.touchUi && state === "streaming");
    if (state !== "streaming") el.hudError.textContent = ""; // the overlay says what happened
    updateControls();
    renderHud();
  }

  function runAction() {
    const action = hook.action;
    if ((action === "reconnect" || action === "restart") && lastBody) {
      start(lastBody, performance.now(), { isReconnect: action === "reconnect" });
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

  function updateControls() {
    const busy = hook.state === "connecting" || hook.state === "streaming";
    el.startBtn.disabled = busy || !modelInfo || !choice;
    el.stopBtn.disabled = !busy;
    el.downloadVideoBtn.disabled = !recorded;
    el.downloadRecordingBtn.disabled = !recorded;
  }

  // ---- downloads: the last session's video and recording, during it and after (while it is listed) ----

  async function download(what) {
    if (!recorded) return;
    const { url, token, id } = recorded;
    const [path, name] = what === "video"
      ? [`${url}/video.mp4`, `worldrtc-${id}.mp4`]
      : [`${url}/recording`, `worldrtc-${id}.json`];
    // fetch, not a plain link: the request may need the session's token.
    const headers = token || apiToken ? { Authorization: `Bearer ${token || apiToken}` } : {};
    try {
      const resp = await fetch(path, { headers });
      if (!resp.ok) {
        const body = await resp.json().catch(() => null);
        throw new Error((body && body.message) || `${resp.status} ${resp.statusText}`);
      }
      const blob = await resp.blob();
      const link = document.createElement("a");
      link.href = URL.createObjectURL(blob);
      link.download = name;
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    } catch (err) {
      showMessage(`Could not download the ${what}: ${err.message}`, true);
    }
  }

  const fmt = (v, digits) => (v === null || v === undefined || !Number.isFinite(v) ? "–" : v.toFixed(digits));

  function renderHud() {
    const st = hook.stats;
    const s = current;
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
    const fps = (modelInfo && modelInfo.fps) || (server && server.fps) || null;
    if (periodS !== null && chunk && chunk.num_frames && fps) {
      const media = chunk.num_frames / fps;
      el.hudChunkPeriod.title = `chunk media ${media.toFixed(2)} s: ${periodS <= media ? "keeping up" : "slower than real time"}`;
    }

    el.hudLatency.textContent = st.g2gP50Ms === null ? "–"
      : `${Math.round(st.g2gP50Ms)} ms p50 · last ${Math.round(st.g2gLastMs)}`;
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
    el.hudKeys.textContent = live && s.heldCodes.size ? heldKeys(s).join(" ").toUpperCase() : "–";
  }

  // ---------------------------------------------------------------- wiring

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
  el.downloadVideoBtn.addEventListener("click", () => download("video"));
  el.downloadRecordingBtn.addEventListener("click", () => download("recording"));
  el.overlayBtn.addEventListener("click", runAction);
  el.imageInput.addEventListener("change", () => {
    readImage(el.imageInput.files && el.imageInput.files[0]);
    el.imageInput.value = "";
  });
  el.panel.addEventListener("dragover", (ev) => {
    if (ev.dataTransfer && [...ev.dataTransfer.types].includes("Files")) {
      ev.preventDefault();
      el.panel.classList.add("dragging");
    }
  });
  el.panel.addEventListener("dragleave", () => el.panel.classList.remove("dragging"));
  el.panel.addEventListener("drop", (ev) => {
    ev.preventDefault();
    el.panel.classList.remove("dragging");
    readImage(ev.dataTransfer && ev.dataTransfer.files && ev.dataTransfer.files[0]);
  });

  el.videoBox.addEventListener("click", (ev) => {
    if (ev.target.closest("button, .touch-controls") || hook.touchUi) return;
    lockPointer();
  });
  wireStick();
  wireTurnButton(el.turnLeftBtn);
  wireTurnButton(el.turnRightBtn);
  el.resetBtn.addEventListener("click", () => {
    if (sessionActive()) resetPose(current);
  });
  wireTouchLook();
  el.timelineBtn.addEventListener("click", toggleTimeline);
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
  window.addEventListener("pagehide", () => {
    if (current && !current.closing) teardown(current, { sendStop: true });
  });

  el.apiToken.value = apiToken;
  el.apiToken.addEventListener("change", () => {
    apiToken = el.apiToken.value.trim();
    try {
      if (apiToken) sessionStorage.setItem("worldrtc.apiToken", apiToken);
      else sessionStorage.removeItem("worldrtc.apiToken");
    } catch (_) { /* storage disabled */ }
    if (!modelInfo) loadModel();
  });

  hook.touchUi = touchScreen();
  document.body.classList.toggle("touch", hook.touchUi);
  setInterval(renderHud, 250);
  setState("idle");
  loadModel();
})();
