// LoRA adapters in the job form: the tenant's (GET /v1/adapters) and the model's shared
// ones, picked in rows with a scale each, up to the model's max_loras; a .safetensors
// file uploaded for the chosen model (POST /v1/adapters), its refusal said beside it.
import { api, ApiError, postForm } from "./api.js";

const $ = (id) => document.getElementById(id);
const UPLOAD_HINT = "A .safetensors LoRA, checked for the chosen model, then offered above.";
const SCALE = { min: -2, max: 2, step: 0.05 };

let adapters = []; // the tenant's, as GET /v1/adapters lists them
let model = null; // the chosen model's view (its lora_family, max_loras, shared_adapters)
let serial = 0; // makes each row's ids unique
let sentRows = []; // the rows behind the last request's `loras`, in its order
let report = () => {};
let changed = () => {};

const rows = () => Array.from($("lora-list").children);
const most = () => (model ? model.max_loras : 0); // 0 where its family has no LoRA

function byDigest(sha256) {
  return adapters.find((adapter) => adapter.sha256 === sha256) || null;
}

// What a row may name for the chosen model: the tenant's adapters of its family, then
// the catalog's shared ones (named by name in a request).
function offered() {
  if (!most()) return [];
  const yours = adapters
    .filter((adapter) => adapter.family === model.lora_family)
    .map((adapter) => ({
      value: `id:${adapter.id}`,
      label: `${adapter.name || adapter.sha256.slice(0, 12)} · rank ${adapter.rank}`,
    }));
  const shared = (model.shared_adapters || []).map((name) => ({
    value: `name:${name}`,
    label: `${name} (shared)`,
  }));
  return [...yours, ...shared];
}

function fillOptions(select) {
  const keep = select.value;
  const blank = document.createElement("option");
  blank.value = "";
  blank.textContent = "Choose an adapter";
  const options = offered().map(({ value, label }) => {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label;
    return option;
  });
  select.replaceChildren(blank, ...options);
  select.value = options.some((option) => option.value === keep) ? keep : "";
}

function renumber() {
  rows().forEach((li, index) => {
    li.querySelector("label.lora-name").textContent = `Adapter ${index + 1}`;
    li.querySelector("button").setAttribute("aria-label", `Remove adapter ${index + 1}`);
  });
  $("add-lora").disabled = rows().length >= most();
}

function addRow(value = "", scale = 1) {
  const number = ++serial;
  const li = document.createElement("li");
  li.className = "lora";
  const nameLabel = document.createElement("label");
  nameLabel.className = "lora-name";
  nameLabel.htmlFor = `lora-${number}-adapter`;
  const select = document.createElement("select");
  select.id = `lora-${number}-adapter`;
  select.className = "lora-adapter";
  select.setAttribute("aria-describedby", "err-loras");
  fillOptions(select);
  select.value = value;
  const scaleLabel = document.createElement("label");
  scaleLabel.htmlFor = `lora-${number}-scale`;
  scaleLabel.textContent = "Scale";
  const scaleBox = document.createElement("input");
  scaleBox.id = `lora-${number}-scale`;
  scaleBox.className = "lora-scale";
  scaleBox.type = "number";
  scaleBox.inputMode = "decimal";
  Object.assign(scaleBox, SCALE);
  scaleBox.value = scale;
  scaleBox.setAttribute("aria-describedby", "err-loras");
  const remove = document.createElement("button");
  remove.type = "button";
  remove.className = "quiet";
  remove.textContent = "Remove";
  remove.addEventListener("click", () => {
    li.remove();
    renumber();
    changed();
  });
  select.addEventListener("change", changed);
  scaleBox.addEventListener("input", changed);
  const name = document.createElement("div");
  name.className = "lora-pick";
  name.append(nameLabel, select);
  const strength = document.createElement("div");
  strength.className = "lora-strength";
  strength.append(scaleLabel, scaleBox);
  li.append(name, strength, remove);
  $("lora-list").append(li);
  renumber();
  return li;
}

// The form follows the chosen model: no adapters for a model that takes none, at most
// its max_loras, only the adapters of its family.
export function offerAdapters(chosen) {
  model = chosen;
  const limit = most();
  $("lora-part").hidden = !limit;
  if (!limit) {
    $("lora-list").replaceChildren();
    $("hint-loras").textContent = `${model.name} takes no adapters.`;
    return;
  }
  for (const li of rows().slice(limit)) li.remove();
  for (const select of document.querySelectorAll(".lora-adapter")) fillOptions(select);
  renumber();
  $("hint-loras").textContent =
    `At most ${limit} for ${model.name}, each with a scale from ${SCALE.min} to ${SCALE.max}` +
    " (1: as trained; negative: the opposite).";
}

export async function loadAdapters() {
  adapters = (await api("/v1/adapters")).data;
  if (model) offerAdapters(model);
}

// The request's `loras`: [{id | name, scale}] for each row with an adapter chosen.
export function chosenLoras() {
  sentRows = rows().filter((li) => li.querySelector("select").value);
  return sentRows.map((li) => {
    const [by, value] = li.querySelector("select").value.split(/:(.*)/s);
    const raw = li.querySelector("input").value;
    const scale = Number(raw);
    return { [by]: value, scale: raw.trim() !== "" && Number.isFinite(scale) ? scale : raw };
  });
}

// The API's 422 under `loras`: a list of messages, or messages by the adapter's place in
// the request and its field. Said beside the adapters; the control it names is returned.
export function showLoraErrors(messages) {
  for (const control of $("lora-list").querySelectorAll("select, input")) {
    control.removeAttribute("aria-invalid");
  }
  if (!messages) {
    $("err-loras").textContent = "";
    return null;
  }
  const texts = [];
  let first = null;
  const mark = (control) => {
    if (!control) return;
    control.setAttribute("aria-invalid", "true");
    first = first || control;
  };
  if (Array.isArray(messages)) {
    texts.push(...messages.map(String));
    mark(rows().length ? rows()[0].querySelector("select") : $("add-lora"));
  } else {
    for (const [index, fields] of Object.entries(messages)) {
      const li = sentRows[Number(index)];
      for (const [field, said] of Object.entries(fields)) {
        const place = `Adapter ${li ? rows().indexOf(li) + 1 : Number(index) + 1}`;
        texts.push(`${place}${field === "scale" ? ", scale" : ""}: ${[].concat(said).join(" ")}`);
        if (li) mark(li.querySelector(field === "scale" ? "input" : "select"));
      }
    }
  }
  $("err-loras").textContent = texts.join(" ");
  return first;
}

// A job's stored `loras` ({sha256, scale, name?}) as a request names them: null when one
// of them is no adapter this page knows (deleted, or listed before it was uploaded).
export function requestLoras(stored) {
  const asked = [];
  for (const lora of stored || []) {
    const known = lora.name ? null : byDigest(lora.sha256);
    if (!lora.name && !known) return null;
    asked.push(lora.name ? { name: lora.name, scale: lora.scale } : { id: known.id, scale: lora.scale });
  }
  return asked;
}

// The form's rows set to a job's stored `loras`.
export function fillLoras(stored) {
  const asked = requestLoras(stored) || [];
  $("lora-list").replaceChildren();
  for (const lora of asked.slice(0, most())) {
    addRow(lora.name ? `name:${lora.name}` : `id:${lora.id}`, lora.scale);
  }
  renumber();
}

// "watercolor × 0.8, ink × -0.5" for a job's caption.
export function describeLoras(stored) {
  return (stored || [])
    .map((lora) => {
      const known = byDigest(lora.sha256);
      const name = lora.name || (known && known.name) || lora.sha256.slice(0, 8);
      return `${name} × ${lora.scale}`;
    })
    .join(", ");
}

function showUploadError(messages) {
  $("err-adapter-file").textContent = messages.join(" ");
  const control = $("f-adapter-file");
  if (messages.length) control.setAttribute("aria-invalid", "true");
  else control.removeAttribute("aria-invalid");
}

// The new adapter goes in the first empty row, else a new row, else the last row.
function choose(value) {
  const empty = rows().find((li) => !li.querySelector("select").value);
  if (empty) empty.querySelector("select").value = value;
  else if (rows().length < most()) addRow(value);
  else rows()[rows().length - 1].querySelector("select").value = value;
}

async function uploadAdapter(file) {
  showUploadError([]);
  const hint = $("hint-adapter-file");
  hint.textContent = `${file.name}: uploading…`;
  const form = new FormData();
  form.append("file", file, file.name);
  if (model) form.append("model", model.name);
  const name = file.name.replace(/\.safetensors$/i, "").slice(0, 200);
  if (name) form.append("name", name);
  try {
    const made = await postForm("/v1/adapters", form);
    if (!adapters.some((adapter) => adapter.id === made.id)) adapters.push(made);
    offerAdapters(model);
    choose(`id:${made.id}`);
    hint.textContent =
      `${made.name || file.name}: rank ${made.rank}, ${made.layers} layers, ` +
      `for ${made.family} models. Chosen above.`;
    changed();
  } catch (error) {
    hint.textContent = UPLOAD_HINT;
    if (!(error instanceof ApiError) || ![413, 415, 422].includes(error.status)) {
      report(error);
      return;
    }
    const errors = (error.body && error.body.errors) || {};
    const said = Object.values({ ...(errors.form || {}), ...(errors.files || {}) }).flat();
    showUploadError(said.length ? said : [error.message]);
    $("f-adapter-file").focus();
  } finally {
    $("f-adapter-file").value = "";
  }
}

// `onReport` takes what is not the field's own (a missing or refused key, a 429);
// `onChange` is told when the adapters sent would change (the estimate counts them).
export function watchAdapters({ onReport, onChange }) {
  report = onReport;
  changed = onChange;
  $("hint-adapter-file").textContent = UPLOAD_HINT;
  $("add-lora").addEventListener("click", () => {
    addRow().querySelector("select").focus();
    changed();
  });
  const file = $("f-adapter-file");
  file.addEventListener("change", () => {
    if (file.files.length) uploadAdapter(file.files[0]);
  });
}
