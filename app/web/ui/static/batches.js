// Batches: a JSON Lines file of POST /v1/jobs bodies, each with its custom_id, sent to
// POST /v1/batches; the batch's counts polled into a progress bar; its results file
// downloaded once it has ended; cancel; the recent batches, each opened again.
import { api, ApiError, local, send } from "./api.js";
import { saveBlob } from "./save.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const LIST_SIZE = 5;
const ENDED = new Set(["completed", "expired", "cancelled", "failed"]);
const STATES = {
  validating: "Validating: its requests are being stored.",
  in_progress: "In progress.",
  finalizing: "Finalizing: every request has ended.",
  completed: "Completed.",
  expired: "Expired: requests not started within its window did not run.",
  cancelling: "Cancelling: running jobs stop at their next step.",
  cancelled: "Cancelled.",
  failed: "Failed.",
};
// A request's count once it has ended, and the counts shown, in this order.
const DONE = ["succeeded", "failed", "canceled", "expired", "invalid"];
const SHOWN = [...DONE, "running", "queued", "pending"];
// The job badges' colours, for a batch's status.
const BADGES = {
  completed: "succeeded",
  failed: "failed",
  expired: "failed",
  cancelling: "canceled",
  cancelled: "canceled",
  in_progress: "running",
  finalizing: "running",
};
const NO_FILE = "Choose a JSON Lines file first: one POST /v1/jobs body a line, each with its custom_id.";

let shown = null; // the batch shown
let pollTimer = null;
let pollRun = 0;
let report = () => {};

// Messages of any depth (a line's fields may nest, as an adapter's scale does) as text.
function flat(messages) {
  if (messages === null || typeof messages !== "object") return String(messages);
  return Object.values(messages).map(flat).join(" ");
}

function showError(messages) {
  $("err-batch-file").textContent = messages.join("\n");
  const control = $("f-batch-file");
  if (messages.length) control.setAttribute("aria-invalid", "true");
  else control.removeAttribute("aria-invalid");
}

// A refused batch: each bad line and its fields (`errors.lines`, 1-based), else the message.
function refusals(error) {
  const lines = error.body && error.body.errors && error.body.errors.lines;
  if (!lines) return [error.message];
  const said = Object.entries(lines).map(([line, fields]) => {
    const parts = Object.entries(fields).map(([name, messages]) =>
      name === "_line" ? flat(messages) : `${name}: ${flat(messages)}`,
    );
    return `Line ${line}: ${parts.join(" ")}`;
  });
  return ["Nothing was stored.", ...said];
}

function ended(counts) {
  return DONE.reduce((sum, name) => sum + (counts[name] || 0), 0);
}

function stateText(batch) {
  const text = STATES[batch.status] || batch.status;
  const errors = batch.errors && batch.errors.data;
  if (batch.status === "failed" && errors && errors.length) {
    return `Failed: ${errors.map((error) => error.message).join(" ")}`;
  }
  return text;
}

function render(batch) {
  shown = batch;
  const counts = batch.counts || {};
  const total = counts.total || 0;
  const done = ended(counts);
  $("batch").hidden = false;
  $("batch").dataset.status = batch.status;
  $("batch-name").textContent = `Batch ${batch.id}`;
  $("batch-state").textContent = stateText(batch);
  const bar = $("batch-progress");
  bar.max = Math.max(total, 1);
  bar.value = done;
  bar.textContent = `${done} of ${total}`;
  const details = SHOWN.filter((name) => counts[name]).map((name) => `${counts[name]} ${name}`);
  $("batch-counts").textContent =
    `${done} of ${total} requests ended` + (details.length ? `: ${details.join(", ")}.` : ".");
  const over = ENDED.has(batch.status);
  $("cancel-batch").hidden = over || batch.status === "cancelling";
  $("batch-results").hidden = !over;
  const line = $("batch-list").querySelector(`li[data-batch-id="${batch.id}"]`);
  if (line) showStatus(line, batch);
}

// Show `batch` and read it again every POLL_MS until it has ended (or another is shown).
function follow(batch) {
  const run = ++pollRun;
  clearTimeout(pollTimer);
  render(batch);
  if (ENDED.has(batch.status)) return;
  pollTimer = setTimeout(async () => {
    if (run !== pollRun) return;
    try {
      const next = await api(local(batch.urls.self));
      if (run === pollRun) follow(next);
    } catch (error) {
      if (run !== pollRun) return;
      $("batch-state").textContent = `Lost the batch's updates: ${error.message}`;
      report(error);
    }
  }, POLL_MS);
}

async function submitBatch() {
  showError([]);
  const input = $("f-batch-file");
  const file = input.files[0];
  if (!file) {
    showError([NO_FILE]);
    input.focus();
    return;
  }
  const button = $("submit-batch");
  button.disabled = true;
  try {
    const response = await send("/v1/batches", {
      method: "POST",
      headers: { "Content-Type": "application/jsonl" },
      body: file,
    });
    input.value = ""; // a second click sends nothing twice
    follow(await response.json());
    loadBatches().catch(report);
  } catch (error) {
    if (error instanceof ApiError && [413, 415, 422, 429].includes(error.status)) {
      showError(refusals(error));
      input.focus();
    } else {
      report(error);
    }
  } finally {
    button.disabled = false;
  }
}

async function cancelBatch() {
  if (!shown) return;
  try {
    follow(await api(local(shown.urls.cancel), { method: "POST" }));
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 409) throw error;
    follow(await api(local(shown.urls.self))); // it had ended meanwhile
  }
}

async function downloadResults() {
  if (!shown) return;
  const response = await send(local(shown.urls.results));
  saveBlob(await response.blob(), `diffq-batch-${shown.id}-results.jsonl`);
}

async function open(id) {
  follow(await api(`/v1/batches/${encodeURIComponent(id)}`));
}

function showStatus(li, batch) {
  li.dataset.status = batch.status;
  const badge = li.querySelector(".badge");
  badge.className = `badge ${BADGES[batch.status] || ""}`;
  badge.textContent = batch.status.replace("_", " ");
}

function item(batch) {
  const li = document.createElement("li");
  li.dataset.batchId = batch.id;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "batch-line";
  const badge = document.createElement("span");
  badge.className = "badge";
  const size = document.createElement("span");
  size.className = "batch-size";
  const total = (batch.counts && batch.counts.total) || 0;
  size.textContent = total === 1 ? "1 request" : `${total} requests`;
  const id = document.createElement("span");
  id.className = "job-prompt";
  id.textContent = batch.id;
  const when = document.createElement("time");
  when.dateTime = new Date(batch.created_at * 1000).toISOString();
  when.textContent = new Date(batch.created_at * 1000).toLocaleString();
  button.append(badge, size, id, when);
  button.addEventListener("click", () => open(batch.id).catch(report));
  li.append(button);
  showStatus(li, batch);
  return li;
}

export async function loadBatches() {
  const page = await api(`/v1/batches?limit=${LIST_SIZE}`);
  $("batch-list").replaceChildren(...page.data.map(item));
  $("batch-none").hidden = page.data.length > 0;
  if (shown) render(shown); // its line as the batch shown is now, not as listed
}

// `onReport` takes what is not the file field's own (a missing or refused key, a lost poll).
export function watchBatches({ onReport }) {
  report = onReport;
  $("batch-form").addEventListener("submit", (event) => {
    event.preventDefault();
    submitBatch();
  });
  $("f-batch-file").addEventListener("change", () => showError([]));
  $("cancel-batch").addEventListener("click", () => cancelBatch().catch(report));
  $("batch-results").addEventListener("click", () => downloadResults().catch(report));
}
