// REST calls and what their errors mean to a person. Every request to the server goes through
// api(), so the API token, the error shapes of server/common/errors.py and FastAPI's validation errors are
// read in one place, and every message the page shows about a refused request is worded here.

import { app } from "./state.js";

const TOKEN_KEY = "worldrtc.apiToken";

// The token from the page address (#token=…, removed from the address bar at once), else the one
// this tab stored; sessionStorage keeps it across reloads without outliving the tab.
export function readApiToken() {
  const m = /(?:^#|&)token=([^&]+)/.exec(window.location.hash);
  if (m) {
    const token = decodeURIComponent(m[1]);
    try {
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch (_) { /* storage disabled: keep it for this page only */ }
    history.replaceState(null, "", window.location.pathname + window.location.search);
    return token;
  }
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch (_) {
    return "";
  }
}

export function storeApiToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch (_) { /* storage disabled */ }
}

export class ApiError extends Error {
  constructor(status, code, message, retryAfterS) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfterS = retryAfterS;
  }
}

export async function api(method, path, body, token) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token || app.apiToken) headers.Authorization = `Bearer ${token || app.apiToken}`;
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    throw unreachable();
  }
  const text = await resp.text();
  if (!resp.ok) throw responseError(resp, text);
  return parseJson(text);
}

function parseJson(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch (_) {
    return null;
  }
}

// A fetch that never got an answer.
export function unreachable() {
  return new ApiError(0, "network", "Cannot reach the server. Is it running, and is this the right address?");
}

// A refused request (`resp` not ok, `text` its body): server/common/errors.py's {error, message}, FastAPI's
// {detail}, or else the status line. Also for the requests that are not JSON (a spectator's SDP offer).
export function responseError(resp, text) {
  const data = parseJson(text);
  const retry = Number.parseFloat(resp.headers.get("Retry-After") || "");
  let message = (data && (data.message || (typeof data.detail === "string" ? data.detail : null))) || "";
  if (!message && data && Array.isArray(data.detail)) message = data.detail.map((d) => d.msg).join("; ");
  if (!message) message = `${resp.status} ${resp.statusText || "error"}`;
  return new ApiError(resp.status, (data && data.error) || `http_${resp.status}`, message,
    Number.isFinite(retry) ? retry : null);
}

export const sentence = (text) => {
  const t = String(text || "").trim();
  return !t || /[.!?…]$/.test(t) ? t : `${t}.`;
};

// Busy, not ready and no network pass: they are retried with backoff rather than offered a fix.
export function transient(err) {
  return err instanceof ApiError && (err.status === 0 || err.status === 429 || err.status === 503);
}

export function describeApiError(err, doing) {
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
