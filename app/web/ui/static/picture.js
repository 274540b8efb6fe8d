// The input image of image to image and inpainting: chosen or dropped, uploaded at once
// (so a refused file is said beside the field before any job), shown with the mask
// painted over it on a canvas of the image's own size. The mask is sent as a PNG upload
// of that size: white where it was painted (redrawn), black elsewhere (kept).
import { ApiError, upload } from "./api.js";

const $ = (id) => document.getElementById(id);
// What is painted, in the canvas's own pixels (the mask is where its alpha is at least half).
const PAINT = "#ff2d55";
// Small images are shown larger, so the brush can be placed: the longer side up to this.
const SHOWN_SIDE = 256;

// Uploads this page made, by digest: a job's input names its images by SHA-256, so the
// job panel shows them and "Same again" sends their ids from here.
const known = new Map();
let chosen = null; // { file, url, pending: Promise<upload>, made: upload | null }
let tool = "brush";
let stroke = null; // the pointer painting and where it was
let onChange = () => {};

export function knownUpload(digest) {
  return (digest && known.get(digest)) || null;
}

function remember(made, url) {
  known.set(made.sha256, { id: made.id, url, width: made.width, height: made.height });
}

// The chosen image's size as the API stored it (null until its upload answers).
export function inputSize() {
  return chosen && chosen.made ? { width: chosen.made.width, height: chosen.made.height } : null;
}

export function onPictureChanged(callback) {
  onChange = callback;
}

function showError(field, messages) {
  $(`err-${field}`).textContent = messages.join(" ");
  const control = $(`f-${field}`);
  if (messages.length) control.setAttribute("aria-invalid", "true");
  else control.removeAttribute("aria-invalid");
}

function choose(file) {
  showError("image", []);
  showError("mask", []);
  const url = URL.createObjectURL(file);
  const token = { file, url, made: null, failed: false };
  chosen = token;
  clearMask(); // a mask painted on another image
  $("input-preview").src = url;
  $("hint-image").textContent = `${file.name}: uploading…`;
  token.pending = upload(file, "image", file.name).then(
    (made) => {
      remember(made, url);
      if (chosen !== token) return made;
      token.made = made;
      sizeMask(made.width, made.height);
      $("hint-image").textContent = `${file.name}: ${made.width} × ${made.height} px.`;
      onChange();
      return made;
    },
    (error) => {
      token.failed = true;
      if (chosen === token) {
        $("editor").hidden = true;
        $("hint-image").textContent = "PNG, JPEG or WebP: choose a file or drop one here.";
        if (error instanceof ApiError) showError("image", error.fields.image || [error.message]);
        else showError("image", [`The upload failed: ${error.message}`]);
        onChange();
      }
      throw error;
    },
  );
  token.pending.catch(() => {}); // said beside the field now; a submit awaits it again
}

// The canvas takes the image's pixel size (clearing the mask when that changes); the
// preview is shown at its own size, small ones larger.
function sizeMask(width, height) {
  const preview = $("input-preview");
  const scale = Math.max(1, Math.min(SHOWN_SIDE / width, SHOWN_SIDE / height));
  preview.width = Math.round(width * scale);
  preview.height = Math.round(height * scale);
  const canvas = $("f-mask");
  if (canvas.width === width && canvas.height === height) return;
  canvas.width = width; // which clears it
  canvas.height = height;
  const brush = $("f-brush"); // in the image's pixels
  brush.max = Math.max(8, Math.round(Math.max(width, height) / 4));
  brush.value = Math.max(2, Math.round(Math.min(width, height) / 10));
  showBrush();
}

function showBrush() {
  $("brush-size").textContent = `${$("f-brush").value} px`;
}

function previewLoaded() {
  const preview = $("input-preview");
  if (!chosen || chosen.failed) return;
  $("editor").hidden = false;
  // The upload's size is the mask's; until it answers, the browser's own reading.
  if (!chosen || !chosen.made) sizeMask(preview.naturalWidth, preview.naturalHeight);
}

function setTool(name) {
  tool = name;
  $("tool-brush").setAttribute("aria-pressed", String(name === "brush"));
  $("tool-eraser").setAttribute("aria-pressed", String(name === "eraser"));
}

function at(event) {
  const canvas = $("f-mask");
  const box = canvas.getBoundingClientRect();
  return {
    x: ((event.clientX - box.left) * canvas.width) / box.width,
    y: ((event.clientY - box.top) * canvas.height) / box.height,
  };
}

function paint(from, to) {
  const context = $("f-mask").getContext("2d");
  const size = Number($("f-brush").value);
  context.globalCompositeOperation = tool === "eraser" ? "destination-out" : "source-over";
  context.fillStyle = PAINT;
  context.strokeStyle = PAINT;
  context.lineWidth = size;
  context.lineCap = "round";
  context.lineJoin = "round";
  context.beginPath();
  if (from === to) {
    context.arc(to.x, to.y, size / 2, 0, 2 * Math.PI);
    context.fill();
  } else {
    context.moveTo(from.x, from.y);
    context.lineTo(to.x, to.y);
    context.stroke();
  }
}

function watchPainting() {
  const canvas = $("f-mask");
  canvas.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    event.preventDefault();
    canvas.setPointerCapture(event.pointerId);
    const point = at(event);
    stroke = { id: event.pointerId, last: point };
    paint(point, point);
    showError("mask", []);
  });
  canvas.addEventListener("pointermove", (event) => {
    if (!stroke || stroke.id !== event.pointerId) return;
    const point = at(event);
    paint(stroke.last, point);
    stroke.last = point;
  });
  const end = (event) => {
    if (stroke && stroke.id === event.pointerId) stroke = null;
  };
  canvas.addEventListener("pointerup", end);
  canvas.addEventListener("pointercancel", end);
}

function clearMask() {
  const canvas = $("f-mask");
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
}

// The mask as a PNG of the image's size: white where painted, black elsewhere (opaque,
// no grey: the API's mask_blur softens the edge). Null when nothing is painted.
function maskPng() {
  const canvas = $("f-mask");
  const { width, height } = canvas;
  const painted = canvas.getContext("2d").getImageData(0, 0, width, height).data;
  const out = document.createElement("canvas");
  out.width = width;
  out.height = height;
  const context = out.getContext("2d");
  const mask = context.createImageData(width, height);
  let any = false;
  for (let i = 0; i < painted.length; i += 4) {
    const value = painted[i + 3] >= 128 ? 255 : 0;
    any = any || value === 255;
    mask.data[i] = value;
    mask.data[i + 1] = value;
    mask.data[i + 2] = value;
    mask.data[i + 3] = 255;
  }
  if (!any) return Promise.resolve(null);
  context.putImageData(mask, 0, 0);
  return new Promise((resolve) => out.toBlob(resolve, "image/png"));
}

function refused(field, message) {
  return new ApiError(422, { message, errors: { json: { [field]: [message] } } });
}

// The request's image fields for `kind`: the input's upload id, and for inpainting the
// painted mask, uploaded now. With no image chosen none is sent: the API's 422 says so.
export async function pictureFields(kind) {
  if (!chosen) return {};
  const made = await chosen.pending; // a refused upload throws its error again here
  const fields = { image: made.id };
  if (kind === "inpaint") {
    const png = await maskPng();
    if (!png) {
      throw refused("mask", "Paint the part of the image to redraw first (nothing is painted).");
    }
    const mask = await upload(png, "mask", "mask.png");
    remember(mask, URL.createObjectURL(png));
    fields.mask = mask.id;
  }
  return fields;
}

// Show the tools of `kind`: the image for the kinds that take one (image to image,
// inpainting, image to video: its first frame), the mask for inpainting.
export function showPicture(kind) {
  $("image-part").hidden = !["img2img", "inpaint", "img2vid"].includes(kind);
  $("mask-part").hidden = kind !== "inpaint";
  $("f-mask").hidden = kind !== "inpaint";
}

function hasFiles(event) {
  return event.dataTransfer && Array.from(event.dataTransfer.types || []).includes("Files");
}

export function watchPicture() {
  const fileInput = $("f-image");
  fileInput.addEventListener("change", () => {
    if (fileInput.files.length) choose(fileInput.files[0]);
  });
  const drop = $("drop");
  for (const name of ["dragenter", "dragover"]) {
    drop.addEventListener(name, (event) => {
      if (!hasFiles(event)) return;
      event.preventDefault();
      drop.classList.add("over");
    });
  }
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    const files = event.dataTransfer.files;
    if (!files.length) return;
    try {
      fileInput.files = files; // the field names the dropped file as it would a chosen one
    } catch {
      // an older browser: the preview and the hint still name it
    }
    choose(files[0]);
  });
  // A file dropped beside the zone would make the browser leave the page to open it.
  for (const name of ["dragover", "drop"]) {
    document.addEventListener(name, (event) => {
      if (hasFiles(event)) event.preventDefault();
    });
  }
  $("input-preview").addEventListener("load", previewLoaded);
  $("input-preview").addEventListener("error", () => {
    $("editor").hidden = true;
  });
  $("tool-brush").addEventListener("click", () => setTool("brush"));
  $("tool-eraser").addEventListener("click", () => setTool("eraser"));
  $("f-brush").addEventListener("input", showBrush);
  $("clear-mask").addEventListener("click", clearMask);
  watchPainting();
}
