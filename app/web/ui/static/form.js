// The request form: the model's limits shown and the API's 422 messages beside their field.
import { api, ApiError } from "./api.js";

const FIELDS = [
  "prompt", "negative_prompt", "model", "width", "height",
  "steps", "guidance_scale", "seed", "num_images",
];
const NUMBERS = new Set(["width", "height", "steps", "guidance_scale", "seed", "num_images"]);
const ESTIMATE_FIELDS = ["model", "width", "height", "steps", "num_images"];
const ESTIMATE_DELAY_MS = 400;

const $ = (id) => document.getElementById(id);
const input = (name) => $(`f-${name}`);
let models = new Map();
let estimateTimer = null;
let estimateRun = 0;

function setText(id, text) {
  $(id).textContent = text;
}

export function showErrors(fields) {
  let first = null;
  for (const name of FIELDS) {
    const messages = fields[name];
    const box = $(`err-${name}`);
    box.textContent = messages ? [].concat(messages).join(" ") : "";
    if (messages) {
      input(name).setAttribute("aria-invalid", "true");
      first = first || input(name);
    } else {
      input(name).removeAttribute("aria-invalid");
    }
  }
  return first;
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
    input("width").value = limits.default_width;
    input("height").value = limits.default_height;
    input("steps").value = limits.default_steps;
    input("guidance_scale").value = limits.default_guidance;
    input("num_images").value = 1;
  }
  setText(
    "hint-size",
    `${limits.min_size} to ${limits.max_width} × ${limits.max_height} px, multiples of ` +
      `${limits.size_multiple}, at most ${limits.max_pixels.toLocaleString("en")} pixels.`,
  );
  setText("hint-steps", `1 to ${limits.max_steps}`);
  setText("hint-guidance_scale", `0 to ${limits.max_guidance}`);
  setText("hint-num_images", `1 to ${limits.max_num_images}`);
  setText("hint-prompt", `At most ${limits.max_prompt_chars} characters.`);
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
  scheduleEstimate();
}

function numberOrText(raw) {
  const value = Number(raw);
  return raw.trim() !== "" && Number.isFinite(value) ? value : raw;
}

// The request body as the API takes it; empty optional fields are left to its defaults.
export function readRequest() {
  const body = {};
  for (const name of FIELDS) {
    const raw = input(name).value;
    if (raw.trim() === "" && name !== "prompt") continue;
    body[name] = NUMBERS.has(name) ? numberOrText(raw) : raw;
  }
  return body;
}

export function fillForm(params, { newSeed = false } = {}) {
  if (params.model && models.has(params.model)) {
    input("model").value = params.model;
    applyLimits(models.get(params.model), false);
  }
  for (const name of FIELDS) {
    if (name === "model" || params[name] === undefined) continue;
    input(name).value = params[name] === null ? "" : params[name];
  }
  if (newSeed) input("seed").value = "";
  scheduleEstimate();
}

function describe(estimate) {
  if (estimate.run_seconds === null) {
    return "Expected time: not known yet (no job has finished on this model).";
  }
  const wait = estimate.queue_seconds > 0.5 ? `, after about ${seconds(estimate.queue_seconds)} in the queue` : "";
  return `Expected time: about ${seconds(estimate.run_seconds)}${wait}.`;
}

export function seconds(value) {
  if (value < 1) return "1 s";
  if (value < 90) return `${Math.round(value)} s`;
  return `${Math.round(value / 60)} min`;
}

async function refreshEstimate() {
  const run = ++estimateRun;
  const body = readRequest();
  const model = body.model;
  if (!model) return;
  const query = new URLSearchParams();
  for (const name of ["width", "height", "steps", "num_images"]) {
    if (body[name] !== undefined) query.set(name, body[name]);
  }
  try {
    const estimate = await api(`/v1/models/${encodeURIComponent(model)}/estimate?${query}`);
    if (run !== estimateRun) return;
    clearErrors(["width", "height", "steps", "num_images"]);
    setText("estimate", describe(estimate));
  } catch (error) {
    if (run !== estimateRun) return;
    if (error instanceof ApiError && error.status === 422) {
      const fields = error.fields;
      for (const name of ["width", "height", "steps", "num_images"]) {
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

export function watchForm() {
  input("model").addEventListener("change", () => {
    applyLimits(models.get(input("model").value), true);
  });
  for (const name of ESTIMATE_FIELDS) {
    input(name).addEventListener("input", scheduleEstimate);
    input(name).addEventListener("change", scheduleEstimate);
  }
}
