// ControlNet in the job form: one of the chosen model's ControlNets (its `controlnets`)
// and a control image, uploaded at once (a refused file is said beside the field), shown
// as its ControlNet will read it (GET /v1/uploads/{id}/control: canny edges, or the
// image as it is), with its scale. Image kinds only; a video kind hides the part.
import { ApiError, send, upload } from "./api.js";

const $ = (id) => document.getElementById(id);

let model = null; // the chosen model's view (its controlnets, max_controls)
let chosen = null; // { file, pending: Promise<upload>, made: upload | null }
let previewUrl = null;
let onChange = () => {};

const offered = () => (model && model.max_controls ? model.controlnets || [] : []);

function showError(messages) {
  $("err-controls").textContent = messages.join(" ");
  const select = $("f-controlnet");
  if (messages.length) select.setAttribute("aria-invalid", "true");
  else select.removeAttribute("aria-invalid");
}

// The chosen model's ControlNets offered (none: the part says so and stays closed).
export function offerControls(view, isImageKind = true) {
  model = view;
  const names = isImageKind ? offered() : [];
  const select = $("f-controlnet");
  const keep = select.value;
  const none = document.createElement("option");
  none.value = "";
  none.textContent = "None";
  const options = names.map((name) => {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    return option;
  });
  select.replaceChildren(none, ...options);
  select.value = names.includes(keep) ? keep : "";
  $("f-controls").hidden = !isImageKind;
  $("hint-controls").textContent = names.length
    ? "A picture whose layout the image follows: its edges (canny), or a map made elsewhere."
    : `${view ? view.name : "This model"} takes no ControlNet.`;
  $("control-part").hidden = !names.length;
  showChosen();
}

function showChosen() {
  const on = $("f-controlnet").value !== "";
  for (const id of ["control-image-field", "control-settings"]) $(id).hidden = !on;
  $("control-preview").hidden = !on || !previewUrl;
}

async function preview() {
  const made = chosen && chosen.made;
  if (!made) return;
  const preprocess = $("f-control-preprocess").value;
  const token = chosen;
  try {
    const response = await send(`/v1/uploads/${made.id}/control?preprocess=${preprocess}`);
    const blob = await response.blob();
    if (chosen !== token) return;
    if (previewUrl) URL.revokeObjectURL(previewUrl);
    previewUrl = URL.createObjectURL(blob);
    $("control-preview").src = previewUrl;
    $("control-preview").alt =
      preprocess === "canny" ? "The control image's edges, as the ControlNet reads them" : "The control image";
    showChosen();
  } catch (error) {
    showError([`The preview failed: ${error.message}`]);
  }
}

function choose(file) {
  showError([]);
  const token = { file, made: null };
  chosen = token;
  $("hint-control-image").textContent = `${file.name}: uploading…`;
  token.pending = upload(file, "controls", file.name).then(
    (made) => {
      if (chosen !== token) return made;
      token.made = made;
      $("hint-control-image").textContent = `${file.name}: ${made.width} × ${made.height} px.`;
      preview();
      onChange();
      return made;
    },
    (error) => {
      if (chosen === token) {
        chosen = null;
        $("hint-control-image").textContent = "PNG, JPEG or WebP.";
        showError(error instanceof ApiError ? [].concat(error.fields.controls || error.message) : [error.message]);
      }
      return null;
    },
  );
}

// The request's `controls`: the chosen ControlNet with its image's upload (awaited).
// How many controls the job would carry (the estimate counts them before any upload).
export function controlCount() {
  const name = $("f-controlnet").value;
  return name && offered().includes(name) ? 1 : 0;
}

export async function chosenControls() {
  const name = $("f-controlnet").value;
  if (!name || !offered().includes(name)) return [];
  if (!chosen) {
    showError(["Choose a control image for the ControlNet, or set it to None."]);
    throw new ApiError(422, { message: "A control image is needed.", errors: {} });
  }
  const made = await chosen.pending;
  if (!made) throw new ApiError(422, { message: "The control image was refused.", errors: {} });
  return [
    {
      controlnet: name,
      image: made.id,
      scale: Number($("f-control-scale").value),
      preprocess: $("f-control-preprocess").value,
    },
  ];
}

// A job's 422 under `controls` (a list of messages, or messages by position and field).
export function showControlErrors(messages) {
  if (!messages) {
    showError([]);
    return null;
  }
  const flat = Array.isArray(messages)
    ? messages
    : Object.values(messages).flatMap((byField) =>
        Object.entries(byField).map(([field, said]) => `${field}: ${[].concat(said).join(" ")}`),
      );
  showError(flat);
  return $("f-controlnet");
}

// "Same again": the ControlNet and its settings (the image is chosen again).
export function fillControls(controls) {
  const [first] = controls || [];
  $("f-controlnet").value = first && offered().includes(first.controlnet) ? first.controlnet : "";
  if (first) {
    $("f-control-scale").value = first.scale;
    $("f-control-preprocess").value = first.preprocess;
  }
  showChosen();
}

export function setupControls(changed) {
  onChange = changed;
  $("f-controlnet").addEventListener("change", () => {
    showError([]);
    showChosen();
    onChange();
  });
  $("f-control-image").addEventListener("change", (event) => {
    const [file] = event.target.files;
    if (file) choose(file);
  });
  $("f-control-preprocess").addEventListener("change", preview);
}
