// Prompts typed while walking: the box under the video sends `prompt {text, transition_chunks}` on
// Enter (server/wire/protocol.py), and each chunk's receipt (its `prompt`: what that chunk's DiT read)
// says when it took effect. The time from Enter to the first frame of the first chunk that read the
// prompt is measured in latency.js, like a key's; the HUD shows the prompt and that time.
// Shown (status.js setState) for a driver of a model that takes live prompts (GET /v1/model `live_prompts`).
// The events the weights learned (GET /v1/model `events`: the embedded world's night, snow, fog,
// dusk and day) are chips under the box: a click types that event's prompt and sends it.

import { send } from "./controls.js";
import { el } from "./dom.js";
import { notePrompt } from "./latency.js";
import { app, hook } from "./state.js";

// One chip per event of the model (none for a model that learned none).
export function showEvents(events) {
  el.eventChips.replaceChildren();
  for (const event of events || []) {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "chip";
    chip.textContent = event.name;
    chip.title = event.prompt ? `Sends “${event.prompt}”` : "Sends no prompt";
    chip.addEventListener("click", () => {
      el.livePrompt.value = event.prompt;
      el.livePromptForm.requestSubmit();
    });
    el.eventChips.append(chip);
  }
  el.eventChips.hidden = el.eventChips.childElementCount === 0;
}

export function wirePrompts() {
  el.livePromptForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const s = app.current;
    if (!s || s.closing || hook.role !== "driver") return;
    const text = el.livePrompt.value.trim();
    const transitionChunks = Number(el.liveTransition.value) || 1;
    const sent = send(s, { type: "prompt", text, transition_chunks: transitionChunks });
    if (!sent) return;
    notePrompt(s, text, sent.t);
    hook.promptSent = { text, transitionChunks, seq: sent.seq };
    el.livePromptStatus.textContent = text ? `Sent: “${text}”. It applies from the next chunk.` : "Sent: no prompt.";
  });
}
