// Wires the page together: key, form, the watched job, the recent jobs and the batches.
import { loadAdapters, requestLoras, watchAdapters } from "./adapters.js";
import { api, ApiError, apiKey } from "./api.js";
import { loadBatches, watchBatches } from "./batches.js";
import {
  edited, fillForm, hideEstimate, loadCatalog, pictureChanged, readJob, showErrors, watchForm,
} from "./form.js";
import { loadJobs, onOpenJob, updateJob } from "./jobs.js";
import { knownUpload, onPictureChanged, watchPicture } from "./picture.js";
import { cancelCurrent, currentJob, onJobChanged, onJobFinished, repeatable, watch } from "./view.js";

const $ = (id) => document.getElementById(id);
let retryTimer = null;
let blockedUntil = 0;

function notice(text) {
  const box = $("notice");
  box.textContent = text;
  box.hidden = !text;
}

// Rate limited: say so, and keep the submit button off until Retry-After has passed.
function rateLimited(error) {
  let left = Math.max(1, Math.ceil(error.retryAfter || 1));
  blockedUntil = Date.now() + left * 1000;
  const submit = $("submit-job");
  submit.disabled = true;
  clearInterval(retryTimer);
  const tick = () => {
    notice(`${error.message} Try again in ${left} s.`);
    if (left-- <= 0) {
      clearInterval(retryTimer);
      submit.disabled = false;
      notice("");
    }
  };
  tick();
  retryTimer = setInterval(tick, 1000);
}

function report(error) {
  if (!(error instanceof ApiError)) {
    notice(`Something went wrong: ${error.message}`);
    return;
  }
  if (error.status === 401 && error.noKey) {
    askForKey("An API key is needed first. Enter one", ", and save it.");
    notice("");
  } else if (error.status === 401) {
    $("key-status").textContent = "The API key was refused; enter a valid one.";
    $("api-key").focus();
    notice("");
  } else if (error.status === 429) {
    rateLimited(error);
  } else if (error.status === 422) {
    const first = showErrors(error.fields);
    notice(first ? "" : error.message);
    if (first) first.focus();
  } else {
    notice(error.message);
  }
}

// Text with the command names set as <code>, built from nodes (never from markup).
function withCode(...parts) {
  return parts.map((part) => {
    if (typeof part === "string") return document.createTextNode(part);
    const code = document.createElement("code");
    code.textContent = part.code;
    return code;
  });
}

// The recent jobs, with the watched job's line as it is now (the list may have been read
// while it was still queued).
async function refreshJobs(options) {
  await loadJobs(options);
  const job = currentJob();
  if (job) updateJob(job);
}

// Where a key comes from, said in the key's hint between `lead` and `tail`, the focus on
// its field.
function askForKey(lead, tail) {
  $("key-status").replaceChildren(
    ...withCode(
      `${lead}: the one `, { code: "diffq up" }, " printed, or a new one from ",
      { code: "diffq keys create --tenant NAME" }, tail,
    ),
  );
  $("api-key").focus();
}

async function start() {
  if (!apiKey.get()) {
    askForKey("Enter an API key", ". The models load once it is saved.");
    return;
  }
  $("key-status").textContent = "Key saved in this browser.";
  try {
    await loadAdapters();
    await loadCatalog();
    await refreshJobs();
    await loadBatches();
  } catch (error) {
    report(error);
  }
}

// Submit the job `body` gives (a function: the form's request is read once the button is
// off, as it may first upload the painted mask).
async function submit(body) {
  showErrors({});
  notice("");
  const button = $("submit-job");
  button.disabled = true;
  try {
    const job = await api("/v1/jobs", { method: "POST", body: await body() });
    hideEstimate();
    watch(job);
    refreshJobs().catch(report);
  } catch (error) {
    report(error);
  } finally {
    if (Date.now() >= blockedUntil) button.disabled = false;
  }
}

async function openJob(id) {
  try {
    watch(await api(`/v1/jobs/${id}`));
    $("current").scrollIntoView({ behavior: "smooth", block: "nearest" });
  } catch (error) {
    report(error);
  }
}

// The job's own normalized input, so fields the form lacks (scheduler, format) carry over.
const REPEATED = [
  "kind", "prompt", "negative_prompt", "model", "width", "height", "steps", "guidance_scale",
  "seed", "num_images", "scheduler", "quality", "output_format", "strength", "mask_blur",
  "masked_only",
  "masked_padding", "num_frames", "fps",
];
// The job's input names its images by digest; a request names them by upload id.
const IMAGES = ["image", "mask"];

function again(newSeed) {
  const job = currentJob();
  if (!job || !repeatable(job)) return;
  fillForm(job.input, { newSeed });
  const body = {};
  for (const name of REPEATED) {
    if (job.input[name] !== null && job.input[name] !== undefined) body[name] = job.input[name];
  }
  for (const name of IMAGES) {
    if (job.input[name]) body[name] = knownUpload(job.input[name]).id;
  }
  const loras = requestLoras(job.input.loras);
  if (loras.length) body.loras = loras;
  if (newSeed) delete body.seed;
  submit(async () => body);
}

document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = apiKey.get();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey.set($("api-key").value.trim());
    start();
  });
  $("forget-key").addEventListener("click", () => {
    apiKey.clear();
    $("api-key").value = "";
    $("key-status").textContent = "Key removed from this browser.";
  });
  $("job-form").addEventListener("submit", (event) => {
    event.preventDefault();
    submit(readJob);
  });
  $("f-prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      $("job-form").requestSubmit();
    }
  });
  $("cancel-job").addEventListener("click", () => cancelCurrent().catch(report));
  $("same-again").addEventListener("click", () => again(false));
  $("new-seed").addEventListener("click", () => again(true));
  $("refresh-jobs").addEventListener("click", () => refreshJobs().catch(report));
  $("more-jobs").addEventListener("click", () => refreshJobs({ more: true }).catch(report));
  onOpenJob(openJob);
  onJobChanged(updateJob);
  onJobFinished(() => refreshJobs().catch(report));
  watchForm();
  watchAdapters({ onReport: report, onChange: edited });
  watchBatches({ onReport: report });
  watchPicture();
  onPictureChanged(pictureChanged);
  start();
});
