// The start image: the server's built-in scenes, or an image the user uploads or drops, and the
// create body they make with the prompt and seed. Images are checked here before upload, so a file
// the server would refuse is refused with a sentence about the file instead of a failed session.

import { el } from "./dom.js";
import { app } from "./state.js";
import { showMessage, updateControls } from "./status.js";

const MAX_SOURCE_BYTES = 64 * 1048576; // a start image file larger than this is refused before reading

// The server's upload limit and the model's resolution, from GET /v1/model.
let maxImageBytes = 0;
let modelSize = { width: 0, height: 0 };

export function adoptLimits(info) {
  maxImageBytes = info.limits.image_max_bytes;
  modelSize = { width: info.width, height: info.height };
}

export function renderScenes(scenes) {
  el.scenes.querySelectorAll(".scene[data-kind='scene']").forEach((n) => n.remove());
  el.scenesEmpty.hidden = scenes.length > 0;
  el.scenesEmpty.textContent = scenes.length ? "" : "No built-in scenes; upload an image.";
  scenes.forEach((scene, i) => {
    const item = sceneItem("scene", scene.name, scene.url, scene.name);
    item.dataset.index = String(i);
    el.scenes.appendChild(item);
  });
  if (!app.choice && scenes.length) selectScene(scenes[0].name);
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
    if (kind === "scene") app.choice = { scene: value };
    else app.choice = { image: wrap.dataset.dataUrl, name: label };
    updateControls();
  });
  const img = document.createElement("img");
  if (app.apiToken && kind === "scene") {
    // <img> cannot send an Authorization header; fetch the thumbnail and show it from a blob.
    fetch(src, { headers: { Authorization: `Bearer ${app.apiToken}` } })
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
    app.choice = { scene: name };
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
  app.choice = { image: dataUrl, name: file.name };
  showMessage(`Using "${file.name}" as the start image.`, false);
  updateControls();
}

export function createBody() {
  const seed = Number(el.seed.value || "0");
  if (!Number.isInteger(seed) || seed < 0 || seed > 2147483647) {
    throw new Error("The seed must be a whole number from 0 to 2147483647.");
  }
  const body = { prompt: el.prompt.value.trim(), seed };
  if (app.choice && app.choice.image) body.image = app.choice.image;
  else if (app.choice && app.choice.scene) body.scene = app.choice.scene;
  else throw new Error("Pick a start scene or upload an image first.");
  return body;
}

export function wireStartImage() {
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
}
