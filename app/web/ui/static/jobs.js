// Recent jobs, newest first, paged with the API's cursor.
import { api, local } from "./api.js";

const PAGE_SIZE = 8;
const $ = (id) => document.getElementById(id);
let nextCursor = null;
let onOpen = () => {};

function item(job) {
  const li = document.createElement("li");
  li.dataset.status = job.status;
  li.dataset.jobId = job.id;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "job";
  const images = (job.result && job.result.images) || [];
  const thumb = document.createElement("span");
  thumb.className = "thumb";
  if (job.status === "succeeded" && images.length && !job.data_removed) {
    const img = document.createElement("img");
    img.src = local(images[0].url);
    img.alt = "";
    img.loading = "lazy";
    thumb.append(img);
  }
  const status = document.createElement("span");
  showStatus(status, job);
  const prompt = document.createElement("span");
  prompt.className = "job-prompt";
  prompt.textContent = job.input.prompt;
  const when = document.createElement("time");
  when.dateTime = job.created_at;
  when.textContent = new Date(job.created_at).toLocaleString();
  button.append(thumb, status, prompt, when);
  button.addEventListener("click", () => onOpen(job.id));
  li.append(button);
  return li;
}

function showStatus(badge, job) {
  badge.className = `badge ${job.status}`;
  badge.textContent = job.data_removed ? "expired" : job.status;
}

// The watched job changed (queued to running, running to succeeded …): its line here says
// so at once, rather than what it was when the list was loaded.
export function updateJob(job) {
  for (const li of $("job-list").children) {
    if (li.dataset.jobId !== job.id) continue;
    li.dataset.status = job.status;
    showStatus(li.querySelector(".badge"), job);
  }
}

export function onOpenJob(callback) {
  onOpen = callback;
}

export async function loadJobs({ more = false } = {}) {
  const query = new URLSearchParams({ limit: PAGE_SIZE });
  if (more && nextCursor) query.set("cursor", nextCursor);
  const page = await api(`/v1/jobs?${query}`);
  const list = $("job-list");
  const items = page.data.map(item);
  if (more) list.append(...items);
  else list.replaceChildren(...items);
  nextCursor = page.next_cursor;
  $("more-jobs").hidden = !nextCursor;
}
