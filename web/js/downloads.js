// The last session's video and recording, during it and after (while the server still lists it).
// fetch, not a plain link: the request may need the session's token, which a link cannot send.

import { el } from "./dom.js";
import { app } from "./state.js";
import { showMessage } from "./status.js";

async function download(what) {
  if (!app.recorded) return;
  const { url, token, id } = app.recorded;
  const [path, name] = what === "video"
    ? [`${url}/video.mp4`, `worldrtc-${id}.mp4`]
    : [`${url}/recording`, `worldrtc-${id}.json`];
  const headers = token || app.apiToken ? { Authorization: `Bearer ${token || app.apiToken}` } : {};
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

export function wireDownloads() {
  el.downloadVideoBtn.addEventListener("click", () => download("video"));
  el.downloadRecordingBtn.addEventListener("click", () => download("recording"));
}
