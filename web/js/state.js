// State that more than one module reads and changes: the live session, the model, the user's
// choices, and the test hook. Modules cannot assign to one another's exported bindings, so what is
// shared and mutable lives on these two objects, in one place, rather than in globals.

// ---- test hook: read by tests/web/test_browser.py and tests/web/test_page.py, updated live ----
export const hook = {
  role: "driver", // driver | spectator (the page opened with a spectator link, see view.js)
  state: "idle", // idle | connecting | waiting | streaming | closed | error
  queue: null, // while in line (waiting.js): {position, waiting, estimatedWaitS} of the last poll
  watchingWhileWaiting: false, // the world shows under the waiting room's overlay
  turnEndsAt: null, // performance.now() when this turn ends (a `turn_ending` came), else null
  sessionId: null,
  error: null,
  errorCode: null, // the server's code of the error shown (e.g. bad_image), null for client-side ones
  action: null, // what the overlay button offers: reconnect | image | scene | token | watch | null
  ended: null, // a spectator's watch: {code, reason} of the server's done, or code "left" after Leave
  shareLink: null, // the driver's spectator link while the session lives (share.js)
  model: null,
  lastSeq: {}, // message type → seq of the last one sent (a chunk's applied_seq ≥ it: applied)
  timeline: null, // the last GET …/timeline the HUD strip drew
  saving: false, // a snapshot's POST is in flight (snapshots.js)
  snapshots: [], // the strip's snapshots, oldest first: {snapshot_id, session_id, chunk_index, bytes}
  parent: null, // the live session's parent {snapshot_id, session_id, chunk_index}: a branch, or rewound
  rewound: null, // the parent of the last "rewound" message
  promptSent: null, // the last prompt typed while walking: {text, transitionChunks, seq} (prompts.js)
  touchUi: false,
  stats: {
    framesDisplayed: 0,
    fps: 0,
    firstFrameS: null,
    g2gP50Ms: null,
    g2gLastMs: null,
    g2gSamples: 0,
    g2gRecentMs: [], // the samples g2gP50Ms is the median of (the last G2G_WINDOW), oldest first
    g2gMethod: null, // "rtp-pts" or "next-frame" (see the latency comment in latency.js)
    g2gLog: [],
    chunksReceived: 0,
    lastChunk: null,
    serverStats: null,
    rttMs: null,
    promptMs: null, // the last typed prompt: Enter → first frame of the first chunk that read it
  },
};
window.worldrtc = hook;

// Line tokens live in localStorage too: after a reload, or a restart of a server that keeps its saves
// on disk, the Snapshots strip lists the saves of the lines this browser drove (snapshots.js).
const LINES_KEY = "worldrtc.lines";
const LINES_KEPT = 20; // the newest lines this browser remembers

export const app = {
  modelInfo: null, // GET /v1/model
  recorded: null, // { url, token, id } of the last session created: what the download buttons fetch
  choice: null, // {scene: name} | {image: dataUrl, name}
  current: null, // the live connection: the driver's session (session.js) or a spectator's watch (spectator.js)
  lastBody: null, // the create body of the last session, for reconnects
  lastLine: null, // the line the last create continued (a branch's), for reconnects
  // A line is a session and every branch of it: a snapshot opens, and a branch is created, only with
  // the bearer of a session of its own line. Line (the first session's id) → its newest session's token.
  lineTokens: readLineTokens(),
  // A server bound beyond loopback wants an API token on its REST routes. It comes from the form or
  // from the page address (#token=…), and lives in sessionStorage (see readApiToken in api.js).
  apiToken: "",
};

function readLineTokens() {
  try {
    const pairs = JSON.parse(window.localStorage.getItem(LINES_KEY) || "[]");
    return new Map(Array.isArray(pairs) ? pairs.filter((p) => Array.isArray(p) && p.length === 2) : []);
  } catch (_) {
    return new Map(); // storage off (a private window) or unreadable: this visit's lines only
  }
}

export function rememberLineToken(line, token) {
  app.lineTokens.delete(line);
  app.lineTokens.set(line, token); // the newest last
  try {
    window.localStorage.setItem(LINES_KEY, JSON.stringify([...app.lineTokens].slice(-LINES_KEPT)));
  } catch (_) { /* storage off: the tokens live as long as the page */ }
}

// True until the server says otherwise: the static help (and an older server) offer the mouse.
export function lookAccepted() {
  const accepts = app.modelInfo && app.modelInfo.accepts;
  return !accepts || accepts.look !== false;
}

// The camera keys a session holds: keys, the stick and the turn buttons may hold the same one.
export function heldKeys(s) {
  return [...new Set(s.heldCodes.values())].sort();
}
