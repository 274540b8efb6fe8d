// The request form: the model's limits shown and the API's 422 messages beside their field.
import { chosenLoras, fillLoras, offerAdapters, showLoraErrors } from "./adapters.js";
import { api, ApiError } from "./api.js";
import {
  chosenControls,
  controlCount,
  fillControls,
  offerControls,
  setupControls,
  showControlErrors,
} from "./controls.js";
import { inputSize, pictureFields, showPicture } from "./picture.js";
import {
  applyVideoLimits, clipHint, isVideo, showVideo, VIDEO_FIELDS,
} from "./video.js";

const FIELDS = [
  "prompt", "negative_prompt", "model", "width", "height",
  "steps", "guidance_scale", "seed", "num_images", "quality", ...VIDEO_FIELDS,
];
const NUMBERS = new Set([
  "width", "height", "steps", "guidance_scale", "seed", "num_images", ...VIDEO_FIELDS,
]);
// Every field a 422 may name that the form shows, in the page's order (the first gets focus;
// `loras`, the adapters, comes last).
const ERROR_FIELDS = [
  "prompt", "negative_prompt", "model", "kind", ...VIDEO_FIELDS, "image", "mask", "mask_blur",
  "masked_only", "strength", "width", "height", "steps", "guidance_scale", "seed", "num_images",
  "quality",
];
export const KIND_NAMES = {
  txt2img: "text to image", img2img: "image to image", inpaint: "inpainting",
  txt2vid: "text to video", img2vid: "image to video",
};
// The kinds whose output takes its size from an input image unless one is typed.
const FROM_IMAGE = new Set(["img2img", "inpaint", "img2vid"]);
// A kind's strength when the request names none (app/kinds).
const DEFAULT_STRENGTH = { img2img: 0.75, inpaint: 1.0 };
const ESTIMATE_FIELDS = [
  "model", "width", "height", "steps", "num_images", "quality", "guidance_scale",
];
// The fields an estimate may refuse (a 422 names them under the field).
const ESTIMATED = ["width", "height", "steps", "num_images", "guidance_scale"];
const ESTIMATE_DELAY_MS = 400;

const $ = (id) => document.getElementById(id);
const input = (name) => $(`f-${name}`);
const kindRadios = () => document.querySelectorAll("input[name=kind]");
let models = new Map();
let estimateTimer = null;
let estimateRun = 0;
// Off once a job is submitted (its own panel says how it goes), back on when the form is
// edited: an "Expected time" left standing beside a finished job reads as that job's.
let estimateOn = true;
// Fewer finished jobs than this, and the fit behind an estimate is rough: the page says so.
const SURE_SAMPLES = 3;

function setText(id, text) {
  $(id).textContent = text;
}

// The control a field's error belongs to (the mode's is its chosen option).
function control(name) {
  return name === "kind" ? document.querySelector("input[name=kind]:checked") : input(name);
}

export function showErrors(fields) {
  let first = null;
  for (const name of ERROR_FIELDS) {
    const messages = fields[name];
    const box = $(`err-${name}`);
    box.textContent = messages ? [].concat(messages).join(" ") : "";
    if (messages) {
      control(name).setAttribute("aria-invalid", "true");
      first = first || control(name);
    } else {
      control(name).removeAttribute("aria-invalid");
    }
  }
  const lora = showLoraErrors(fields.loras);
  const controls = showControlErrors(fields.controls);
  return first || lora || controls;
}

function clearErrors(names) {
  for (const name of names) {
    $(`err-${name}`).textContent = "";
    input(name).removeAttribute("aria-invalid");
  }
}

function applyLimits(model, fillDefaults) {
  const limits = model.limits;
  for (const name of ["width", "height"]) {
    const box = input(name);
    box.min = limits.min_size;
    box.max = name === "width" ? limits.max_width : limits.max_height;
    box.step = limits.size_multiple;
  }
  input("steps").min = 1;
  input("steps").max = limits.max_steps;
  input("guidance_scale").min = 0;
  input("guidance_scale").max = limits.max_guidance;
  input("num_images").max = limits.max_num_images;
  input("prompt").maxLength = limits.max_prompt_chars;
  input("negative_prompt").maxLength = limits.max_prompt_chars;
  if (fillDefaults) {
    if (!FROM_IMAGE.has(kind())) {
      input("width").value = limits.default_width;
      input("height").value = limits.default_height;
    }
    input("steps").value = limits.default_steps;
    input("guidance_scale").value = limits.default_guidance;
    input("num_images").value = 1;
  }
  applyVideoLimits(model, fillDefaults);
  offerKinds(model);
  offerAdapters(model);
  offerControls(model, !isVideo(kind()));
  sizeHint();
  offerTiers(model, fillDefaults);
  setText("hint-steps", `1 to ${limits.max_steps}`);
  setText("hint-guidance_scale", `0 to ${limits.max_guidance}`);
  setText("hint-num_images", `1 to ${limits.max_num_images}`);
  setText("hint-prompt", `At most ${limits.max_prompt_chars} characters.`);
}

// The output size an input of width x height gives on `model` when the request names none:
// The model's quality tiers (GET /v1/models `quality`), its default chosen unless the one
// chosen is offered too.
function offerTiers(model, fillDefaults) {
  const select = input("quality");
  const quality = model.quality || { default: "exact", tiers: { exact: {} } };
  const kept = select.value;
  select.replaceChildren(...Object.keys(quality.tiers).map((name) => {
    const option = document.createElement("option");
    option.value = option.textContent = name;
    return option;
  }));
  select.value = !fillDefaults && kept in quality.tiers ? kept : quality.default;
}

// app/kinds/images.py's fit_size (the same shape, scaled down into the model's limits).
export function fitSize(model, width, height) {
  const limits = model.limits;
  if (model.sizes_required && model.sizes.length) {
    const aspect = width / height;
    const tiers = model.sizes.map((size) => size.split("x").map(Number));
    const cost = ([w, h]) => [Math.abs(w / h - aspect), Math.abs(w * h - width * height)];
    return tiers.reduce((best, tier) => {
      const [a, b] = [cost(tier), cost(best)];
      return a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]) ? tier : best;
    });
  }
  const scale = Math.min(
    1,
    limits.max_width / width,
    limits.max_height / height,
    (limits.max_pixels / (width * height)) ** 0.5,
  );
  const multiple = limits.size_multiple;
  const side = (value, most) =>
    Math.min(
      Math.floor(most / multiple) * multiple,
      Math.max(limits.min_size, Math.floor(Math.floor(value) / multiple) * multiple),
    );
  return [side(width * scale, limits.max_width), side(height * scale, limits.max_height)];
}

function sizeHint() {
  const model = models.get(input("model").value);
  if (!model) return;
  const limits = model.limits;
  const range =
    `${limits.min_size} to ${limits.max_width} × ${limits.max_height} px, multiples of ` +
    `${limits.size_multiple}, at most ${limits.max_pixels.toLocaleString("en")} pixels.`;
  if (!FROM_IMAGE.has(kind())) {
    setText("hint-size", range);
    return;
  }
  const size = inputSize();
  const fitted = size ? fitSize(model, size.width, size.height) : null;
  setText(
    "hint-size",
    `${range} Left empty, the output takes the input's size within these` +
      (fitted ? `: ${fitted[0]} × ${fitted[1]}.` : "."),
  );
}

// The job's kind: the chosen mode's, or for Video where the clip starts from (the prompt,
// or a first image).
export function kind() {
  const chosen = document.querySelector("input[name=kind]:checked");
  if (!chosen) return "txt2img";
  if (chosen.value !== "video") return chosen.value;
  const from = document.querySelector("input[name=video_from]:checked");
  return from ? from.value : "txt2vid";
}

// The modes the model offers (its `kinds`); one it lacks is hidden, and the form moves to
// the first it offers when the chosen one goes. Video stands for both video kinds, each a
// "Start from" choice.
function offerKinds(model) {
  const kinds = model.kinds || ["txt2img"];
  for (const radio of [...kindRadios(), ...document.querySelectorAll("input[name=video_from]")]) {
    const offered = radio.value === "video" ? kinds.some(isVideo) : kinds.includes(radio.value);
    radio.disabled = !offered;
    radio.closest("label").hidden = !offered;
  }
  // Said for what it lacks among the kinds of its own medium (images, or video).
  const others = Object.keys(KIND_NAMES).filter(
    (name) => !kinds.includes(name) && isVideo(name) === isVideo(kinds[0]),
  );
  setText(
    "hint-kind",
    others.length ? `${model.name} offers ${kinds.map((name) => KIND_NAMES[name]).join(" and ")} only.` : "",
  );
  if (!kinds.includes(kind())) setKind(kinds[0]);
}

// Switch the form to `name`: its fields shown, its strength's default, and the size
// left to the input's for the image kinds (the model's default for text to image).
export function setKind(name) {
  if (isVideo(name)) input("kind-video").checked = true;
  input(`kind-${name}`).checked = true;
  kindChanged();
}

function kindChanged() {
  const name = kind();
  showPicture(name);
  showVideo(name);
  offerControls(models.get(input("model").value) || null, !isVideo(name));
  if (DEFAULT_STRENGTH[name] !== undefined) {
    input("strength").value = DEFAULT_STRENGTH[name];
    showStrength();
  }
  const model = models.get(input("model").value);
  const fromImage = FROM_IMAGE.has(name);
  for (const side of ["width", "height"]) {
    const box = input(side);
    box.placeholder = fromImage ? "the input's" : "model default";
    if (fromImage) box.value = "";
    else if (model && box.value === "") box.value = model.limits[`default_${side}`];
  }
  sizeHint();
  edited();
}

function showStrength() {
  $("strength-value").textContent = Number(input("strength").value).toFixed(2);
}

export async function loadCatalog() {
  const catalog = await api("/v1/models");
  models = new Map(catalog.data.map((model) => [model.name, model]));
  const select = input("model");
  const chosen = select.value || catalog.default_model;
  select.replaceChildren(
    ...catalog.data.map((model) => {
      const option = document.createElement("option");
      option.value = model.name;
      option.textContent = model.default ? `${model.name} (default)` : model.name;
      return option;
    }),
  );
  select.value = models.has(chosen) ? chosen : catalog.default_model;
  applyLimits(models.get(select.value), true);
  estimateOn = true;
  scheduleEstimate();
}

function numberOrText(raw) {
  const value = Number(raw);
  return raw.trim() !== "" && Number.isFinite(value) ? value : raw;
}

// The request body as the API takes it; empty optional fields are left to its defaults.
// Without its images (readJob adds them).
export function readRequest() {
  const body = { kind: kind() };
  const video = isVideo(body.kind);
  for (const name of FIELDS) {
    // A clip is one (no image count); the video fields are the video kinds' alone.
    if (video ? name === "num_images" : VIDEO_FIELDS.includes(name)) continue;
    const raw = input(name).value;
    if (raw.trim() === "" && name !== "prompt") continue;
    body[name] = NUMBERS.has(name) ? numberOrText(raw) : raw;
  }
  if (DEFAULT_STRENGTH[body.kind] !== undefined) body.strength = Number(input("strength").value);
  if (body.kind === "inpaint") {
    const blur = input("mask_blur").value;
    if (blur.trim() !== "") body.mask_blur = numberOrText(blur);
    body.masked_only = input("masked_only").checked;
  }
  const loras = chosenLoras();
  if (loras.length) body.loras = loras;
  return body;
}

// The whole job request: the form's fields and, for the image kinds, the input image's
// upload and the painted mask's (uploaded now).
export async function readJob() {
  const body = readRequest();
  const controls = isVideo(body.kind) ? [] : await chosenControls();
  if (controls.length) body.controls = controls;
  if (!FROM_IMAGE.has(body.kind)) return body;
  return { ...body, ...(await pictureFields(body.kind)) };
}

export function fillForm(params, { newSeed = false } = {}) {
  if (params.model && models.has(params.model)) {
    input("model").value = params.model;
    applyLimits(models.get(params.model), false);
  }
  const wanted = params.kind || "txt2img";
  if (wanted !== kind() && !input(`kind-${wanted}`).disabled) setKind(wanted);
  if (params.strength !== undefined) {
    input("strength").value = params.strength;
    showStrength();
  }
  if (params.mask_blur !== undefined) input("mask_blur").value = params.mask_blur;
  if (params.masked_only !== undefined) input("masked_only").checked = params.masked_only;
  for (const name of FIELDS) {
    if (name === "model" || params[name] === undefined) continue;
    input(name).value = params[name] === null ? "" : params[name];
  }
  fillLoras(params.loras);
  fillControls(params.controls);
  if (newSeed) input("seed").value = "";
  clipHint(models.get(input("model").value));
  scheduleEstimate();
}

export function describe(estimate) {
  if (estimate.run_seconds === null) {
    return "Expected time: not known yet (no job has finished on this model).";
  }
  const wait = estimate.queue_seconds > 0.5 ? `, after about ${seconds(estimate.queue_seconds)} in the queue` : "";
  const jobs = estimate.samples === 1 ? "1 finished job" : `${estimate.samples} finished jobs`;
  const rough = estimate.samples < SURE_SAMPLES ? ` A rough guess: it rests on ${jobs} on this model.` : "";
  return `Expected time: about ${seconds(estimate.run_seconds)}${wait}.${rough}`;
}

export function seconds(value) {
  if (value < 1) return "1 s";
  if (value < 90) return `${Math.round(value)} s`;
  return `${Math.round(value / 60)} min`;
}

// The estimate's query. An image job costs what a text to image job of its output size
// and of the steps its strength leaves would (the estimate counts denoising steps), so it
// is asked as one: the output's size is the input's fitted to the model, unless typed.
// Null while an image job has no input to size it by. A clip is asked as its kind with its
// frames (the estimate counts steps x frames).
function estimateQuery(body) {
  const query = new URLSearchParams();
  const asked = { ...body };
  const model = models.get(body.model);
  if (isVideo(body.kind)) {
    query.set("kind", body.kind);
    if (body.num_frames !== undefined) query.set("num_frames", String(body.num_frames));
  }
  if (FROM_IMAGE.has(body.kind)) {
    if (asked.width === undefined || asked.height === undefined) {
      const size = inputSize();
      if (!size) return null;
      const [width, height] = fitSize(model, size.width, size.height);
      asked.width = asked.width ?? width;
      asked.height = asked.height ?? height;
    }
    const steps = asked.steps ?? model.limits.default_steps;
    if (typeof steps === "number" && body.strength !== undefined) {
      asked.steps = Math.max(1, Math.min(steps, Math.floor(steps * body.strength)));
    }
  }
  // The tier counts its share of the work (a guidance cut runs fewer rows), and the
  // guidance whether there is any to cut.
  for (const name of ["width", "height", "steps", "num_images", "quality", "guidance_scale"]) {
    if (asked[name] !== undefined) query.set(name, asked[name]);
  }
  if (body.loras) query.set("loras", body.loras.length);
  const controls = isVideo(body.kind) ? 0 : controlCount();
  if (controls) query.set("controls", controls);
  return query;
}

async function refreshEstimate() {
  if (!estimateOn) return;
  const run = ++estimateRun;
  const body = readRequest();
  const model = body.model;
  if (!model || !models.has(model)) return;
  const query = estimateQuery(body);
  if (!query) {
    setText("estimate", "");
    return;
  }
  try {
    const estimate = await api(`/v1/models/${encodeURIComponent(model)}/estimate?${query}`);
    if (run !== estimateRun) return;
    clearErrors(ESTIMATED);
    setText("estimate", describe(estimate));
  } catch (error) {
    if (run !== estimateRun) return;
    if (error instanceof ApiError && error.status === 422) {
      const fields = error.fields;
      for (const name of ESTIMATED) {
        $(`err-${name}`).textContent = fields[name] ? fields[name].join(" ") : "";
        if (fields[name]) input(name).setAttribute("aria-invalid", "true");
        else input(name).removeAttribute("aria-invalid");
      }
      setText("estimate", "");
    } else {
      setText("estimate", "");
    }
  }
}

export function scheduleEstimate() {
  clearTimeout(estimateTimer);
  estimateTimer = setTimeout(refreshEstimate, ESTIMATE_DELAY_MS);
}

// A job was submitted: its panel takes over; the estimate returns when the form changes.
export function hideEstimate() {
  estimateOn = false;
  estimateRun++; // an answer still on its way is dropped
  clearTimeout(estimateTimer);
  setText("estimate", "");
}

// The form changed in a way the estimate may follow (the adapters call it too).
export function edited() {
  estimateOn = true;
  scheduleEstimate();
}

// The chosen image changed (or its upload answered): its size is the output's default.
export function pictureChanged() {
  sizeHint();
  edited();
}

export function watchForm() {
  setupControls(edited);
  input("model").addEventListener("change", () => {
    applyLimits(models.get(input("model").value), true);
  });
  for (const name of ESTIMATE_FIELDS) {
    input(name).addEventListener("input", edited);
    input(name).addEventListener("change", edited);
  }
  for (const name of VIDEO_FIELDS) {
    input(name).addEventListener("input", () => {
      clipHint(models.get(input("model").value));
      edited();
    });
  }
  for (const radio of kindRadios()) radio.addEventListener("change", kindChanged);
  for (const radio of document.querySelectorAll("input[name=video_from]")) {
    radio.addEventListener("change", kindChanged);
  }
  input("strength").addEventListener("input", () => {
    showStrength();
    edited();
  });
}
