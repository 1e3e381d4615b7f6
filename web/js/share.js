// The driver's share control: a link that lets others watch the live session (never steer it), how
// many watch now (the server's stats), and a new link that ends the old one. The watch token in the
// link is a capability for this one session, issued with the create; POST …/watch-token revokes it
// (its spectators end with done `revoked`) and issues another. The control shows only while the
// session lives: when it ends, so do its spectators, and the link opens nothing.

import { api, describeApiError } from "./api.js";
import { el } from "./dom.js";
import { spectatorLink } from "./link.js";
import { hook } from "./state.js";

let shared = null; // the session whose link is shown

export function showShare(s, created) {
  if (!created.watch_url || !created.watch_token) return; // a server without spectators
  shared = s;
  setLink(created.watch_url, created.watch_token);
  showWatching(s, 0);
  note("");
  el.share.hidden = false;
}

export function hideShare(s) {
  if (shared !== s) return;
  shared = null;
  hook.shareLink = null;
  el.shareLink.value = "";
  el.shareCount.textContent = "";
  note("");
  el.share.hidden = true;
}

// `n`: the stats message's `spectators`, everyone watching s now.
export function showWatching(s, n) {
  if (shared !== s || typeof n !== "number") return;
  el.shareCount.textContent = n === 0 ? "Nobody is watching."
    : n === 1 ? "1 spectator is watching." : `${n} spectators are watching.`;
}

function setLink(watchUrl, watchToken) {
  const link = spectatorLink(watchUrl, watchToken);
  el.shareLink.value = link;
  hook.shareLink = link;
}

function note(text, isError = false) {
  el.shareNote.textContent = text;
  el.shareNote.classList.toggle("error", isError && Boolean(text));
}

async function copyLink() {
  const link = el.shareLink.value;
  if (!link) return;
  // The clipboard API needs a secure context (https, or this machine) and may still be refused.
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(link);
      note("Copied. Whoever opens the link watches this session; nobody but you steers it.");
      return;
    } catch (_) { /* refused: select it instead */ }
  }
  el.shareLink.focus();
  el.shareLink.select();
  note("The link is selected: copy it with Ctrl+C (\u2318C on a Mac).");
}

async function newLink() {
  const s = shared;
  if (!s || !s.url) return;
  el.shareNewBtn.disabled = true;
  note("Making a new link\u2026");
  try {
    const fresh = await api("POST", `${s.url}/watch-token`, undefined, s.token);
    if (shared !== s) return; // the session ended meanwhile: its spectators ended with it
    setLink(fresh.watch_url, fresh.watch_token);
    note("A new link. The old one opens nothing now, and whoever watched with it was let go.");
  } catch (err) {
    if (shared === s) note(describeApiError(err, "Could not make a new link"), true);
  } finally {
    el.shareNewBtn.disabled = false;
  }
}

export function wireShare() {
  el.shareCopyBtn.addEventListener("click", copyLink);
  el.shareNewBtn.addEventListener("click", newLink);
  el.shareLink.addEventListener("focus", () => el.shareLink.select());
}
