// The job being watched: its state, a progress bar per step, cancel, and its images.
import { describeLoras, requestLoras } from "./adapters.js";
import { api, ApiError, local } from "./api.js";
import { seconds } from "./form.js";
import { knownUpload } from "./picture.js";
import { download } from "./save.js";
import { follow } from "./stream.js";
import { clipFigures, isVideo } from "./video.js";

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(["succeeded", "failed", "canceled"]);
const STAGES = {
  queued: "Queued",
  loading: "Loading the model",
  encoding_prompt: "Reading the prompt",
  denoising: "Denoising",
  decoding: "Decoding",
  uploading: "Saving the images",
  done: "Done",
};

let current = null; // the job shown
let watching = null; // AbortController of its stream
let onFinished = () => {};
let onChanged = () => {};

export function onJobFinished(callback) {
  onFinished = callback;
}

// Called with the job each time the watched job is shown in a new status.
export function onJobChanged(callback) {
  onChanged = callback;
}

export function currentJob() {
  return current;
}

function stateText(job, progress) {
  if (job.status === "queued") {
    const position = progress.queue_position ?? job.queue_position;
    const eta = progress.eta_seconds ?? job.eta_seconds;
    if (position === null || position === undefined) return "Queued."; // the 202 has none
    const ahead = position ? `${position} ahead` : "next in line";
    const when = eta === null || eta === undefined ? "" : `, starts in about ${seconds(eta)}`;
    return `Queued: ${ahead}${when}.`;
  }
  if (job.status === "running") {
    const clip = isVideo(job.input.kind) && progress.stage === "uploading";
    const stage = clip ? "Encoding and saving the clip" : STAGES[progress.stage] || "Running";
    if (progress.stage === "denoising" && progress.total_steps) {
      return `Running: ${stage.toLowerCase()}, step ${progress.step} of ${progress.total_steps}.`;
    }
    return `Running: ${stage.toLowerCase()}.`;
  }
  if (job.status === "succeeded") {
    if (job.data_removed) return "Succeeded; its images were removed after the retention period (410).";
    const took = job.metrics && job.metrics.run_seconds;
    return took ? `Succeeded in ${took.toFixed(1)} s.` : "Succeeded.";
  }
  const error = job.error || {};
  if (job.status === "canceled") {
    return error.code === "deadline"
      ? "Canceled: it had not started before its deadline."
      : "Canceled.";
  }
  return `Failed (${error.code || "error"}): ${error.message || "no message"}`;
}

function showProgress(job, progress) {
  const bar = $("job-progress");
  const percent = job.status === "succeeded" ? 100 : Number(progress.percent || 0);
  bar.value = percent;
  bar.textContent = `${Math.round(percent)}%`;
  bar.dataset.step = progress.step || 0;
  $("job-state").textContent = stateText(job, progress);
  $("current").dataset.status = job.status;
}

function caption(job, image) {
  const input = job.input;
  const strength = input.strength === undefined ? "" : ` · strength ${input.strength}`;
  const loras = input.loras && input.loras.length ? ` · LoRA ${describeLoras(input.loras)}` : "";
  return (
    `seed ${image.seed} · ${image.width}×${image.height} · ${input.steps} steps${strength} · ` +
    `guidance ${input.guidance_scale} · ${job.model}${loras}`
  );
}

// The job's input image with its mask over it, where this page uploaded them (a job names
// them by digest); shown first, the results beside it.
function inputs(job) {
  const image = knownUpload(job.input.image);
  if (!image) return [];
  const figure = document.createElement("figure");
  figure.className = "input";
  const stack = document.createElement("div");
  stack.className = "stack";
  const img = document.createElement("img");
  img.src = local(image.url);
  img.width = image.width;
  img.height = image.height;
  img.alt = "The job's input image";
  stack.append(img);
  const mask = knownUpload(job.input.mask);
  if (mask) {
    const over = document.createElement("img");
    over.className = "mask";
    over.src = local(mask.url);
    over.alt = "Its mask: the light part is redrawn";
    stack.append(over);
  }
  const text = document.createElement("figcaption");
  text.textContent = `${mask ? "Input and mask" : "Input"} · ${image.width}×${image.height}`;
  figure.append(stack, text);
  return [figure];
}

// Whether "Same again" can send the job's request: its input images are uploads this page
// knows the ids of, and its adapters are ones it lists.
export function repeatable(job) {
  return (
    ["image", "mask"].every((name) => !job.input[name] || knownUpload(job.input[name])) &&
    requestLoras(job.input.loras) !== null
  );
}

function showImages(job) {
  const box = $("job-images");
  box.classList.toggle("beside", Boolean(job.input.image));
  const images = (job.result && job.result.images) || [];
  if (job.data_removed) {
    box.replaceChildren(...inputs(job));
    return;
  }
  if (job.result && job.result.videos) {
    box.replaceChildren(...inputs(job), ...clipFigures(job)); // each clip's poster is its own
    return;
  }
  box.replaceChildren(
    ...inputs(job),
    ...images.map((image, index) => {
      const figure = document.createElement("figure");
      const img = document.createElement("img");
      img.src = local(image.url);
      img.width = image.width;
      img.height = image.height;
      img.alt = `Image ${index + 1} of the job: ${job.input.prompt}`;
      const text = document.createElement("figcaption");
      text.textContent = caption(job, image);
      const save = document.createElement("button");
      save.type = "button";
      save.className = "download";
      save.textContent = "Download";
      const extension = (image.content_type || "image/png").split("/")[1];
      save.addEventListener("click", () =>
        download(local(image.url), `diffq-${job.id}-${index}.${extension}`),
      );
      figure.append(img, text, save);
      return figure;
    }),
  );
}

function render(job, progress) {
  if (!current || current.id !== job.id || current.status !== job.status) onChanged(job);
  current = job;
  $("current").hidden = false;
  $("job-prompt").textContent = job.input.prompt;
  const terminal = TERMINAL.has(job.status);
  $("cancel-job").hidden = terminal;
  $("same-again").hidden = !terminal || !repeatable(job);
  $("new-seed").hidden = !terminal || !repeatable(job);
  showProgress(job, progress || job.progress || {});
  if (terminal) showImages(job);
  else {
    $("job-images").classList.toggle("beside", Boolean(job.input.image));
    $("job-images").replaceChildren(...inputs(job));
  }
}

// Show `job` and follow its events until it finishes (or another job is shown).
export function watch(job) {
  if (watching) watching.abort();
  const controller = new AbortController();
  watching = controller;
  render(job);
  if (TERMINAL.has(job.status)) return;
  let progress = job.progress || {};
  follow(
    local(job.urls.events),
    (name, data) => {
      if (controller.signal.aborted) return true;
      if (name === "status") {
        progress = data.progress || progress;
        render(data, progress);
        if (TERMINAL.has(data.status)) {
          onFinished(data);
          return true;
        }
      } else if (name === "progress") {
        progress = data;
        showProgress(current, progress);
        if (current.status === "queued" && data.stage && data.stage !== "queued") {
          render({ ...current, status: "running" }, progress);
        }
      }
      return false;
    },
    controller.signal,
  ).catch((error) => {
    $("job-state").textContent = `Lost the job's updates: ${error.message}`;
  });
}

export async function cancelCurrent() {
  if (!current) return;
  try {
    const job = await api(`/v1/jobs/${current.id}/cancel`, { method: "POST" });
    render(job);
    onFinished(job);
    if (watching) watching.abort();
  } catch (error) {
    if (error instanceof ApiError && error.status === 409) {
      const job = await api(`/v1/jobs/${current.id}`);
      watch(job);
    } else {
      throw error;
    }
  }
}
