// Wires the page together: key, form, the watched job and the recent jobs.
import { api, ApiError, apiKey } from "./api.js";
import { fillForm, loadCatalog, readRequest, showErrors, watchForm } from "./form.js";
import { loadJobs, onOpenJob } from "./jobs.js";
import { cancelCurrent, currentJob, onJobFinished, watch } from "./view.js";

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
  if (error.status === 401) {
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

async function start() {
  if (!apiKey.get()) {
    $("key-status").textContent = "Enter an API key (diffq keys create, or the one `diffq up` printed).";
    $("api-key").focus();
    return;
  }
  $("key-status").textContent = "Key saved in this browser.";
  try {
    await loadCatalog();
    await loadJobs();
  } catch (error) {
    report(error);
  }
}

async function submit(body) {
  showErrors({});
  notice("");
  const button = $("submit-job");
  button.disabled = true;
  try {
    const job = await api("/v1/jobs", { method: "POST", body });
    watch(job);
    loadJobs().catch(report);
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
  "prompt", "negative_prompt", "model", "width", "height", "steps", "guidance_scale",
  "seed", "num_images", "scheduler", "output_format",
];

function again(newSeed) {
  const job = currentJob();
  if (!job) return;
  fillForm(job.input, { newSeed });
  const body = {};
  for (const name of REPEATED) {
    if (job.input[name] !== null && job.input[name] !== undefined) body[name] = job.input[name];
  }
  if (newSeed) delete body.seed;
  submit(body);
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
    submit(readRequest());
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
  $("refresh-jobs").addEventListener("click", () => loadJobs().catch(report));
  $("more-jobs").addEventListener("click", () => loadJobs({ more: true }).catch(report));
  onOpenJob(openJob);
  onJobFinished(() => loadJobs().catch(report));
  watchForm();
  start();
});
