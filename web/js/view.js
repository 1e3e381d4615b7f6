// Which of the page's two views shows. The driver's is index.html as written: the start form, the
// keys and their help, the share control, the snapshots and the downloads. A spectator's (the page opened with a
// spectator link) keeps the video, the HUD rows that mean something to someone who does not steer,
// a label that says so, and Leave. Nothing a spectator cannot use stays on screen: its keys are
// never wired (main.js), and the driver's routes (recording, video, timeline) want the driver's token.

import { el } from "./dom.js";
import { hook } from "./state.js";

export function showSpectatorView() {
  hook.role = "spectator";
  document.body.dataset.role = "spectator";
  document.title = "worldrtc \u00b7 watching";
  const driverOnly = [el.form, el.help, el.share, el.snapshots, el.touchControls, el.lookBtn, el.hudStrip,
    ...el.hudDriverRows];
  for (const node of driverOnly) node.hidden = true;
  el.watchPanel.hidden = false;
  el.watchBadge.hidden = false;
  el.modelName.textContent = "joining a session\u2026";
  el.videoBox.setAttribute("aria-label", "Generated world, steered by its driver. This is a spectator's view: " +
    "you watch it, you cannot steer it.");
  // The keys row shows what the driver holds: the keys the last chunk was generated with.
  el.hudKeys.previousElementSibling.textContent = "driver's keys";
  el.hudKeys.title = "the keys the driver held for the last chunk";
}
