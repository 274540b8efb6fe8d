// The API, called with the key kept in this browser's storage (never in a URL).
const KEY_NAME = "diffq.apiKey";

// The API writes its links on its configured public URL; the page reads them from the
// origin it was loaded from, whatever name that is (localhost, 127.0.0.1, an internal
// host). Links elsewhere (S3's presigned URLs) are left as they are.
export function local(url) {
  const parsed = new URL(url, location.href);
  if (!/^\/(v1|files)\//.test(parsed.pathname)) return url;
  return parsed.pathname + parsed.search;
}

export const apiKey = {
  get: () => localStorage.getItem(KEY_NAME) || "",
  set: (value) => localStorage.setItem(KEY_NAME, value),
  clear: () => localStorage.removeItem(KEY_NAME),
};

export class ApiError extends Error {
  constructor(status, body, retryAfter) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.retryAfter = retryAfter ? Number(retryAfter) : null;
    // Set on the 401 the page answers itself, when no key is saved (nothing was sent).
    this.noKey = false;
  }

  // Validation messages by field name: the body's errors.json or errors.query.
  get fields() {
    const errors = (this.body && this.body.errors) || {};
    return { ...(errors.query || {}), ...(errors.json || {}) };
  }
}

export function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${apiKey.get()}`, ...extra };
}

// Without a saved key no request is sent (the API would only count a failure against
// this address): the caller gets a 401 that says a key is needed.
function needKey() {
  if (apiKey.get()) return;
  const error = new ApiError(401, { message: "An API key is needed." });
  error.noKey = true;
  throw error;
}

// A call with the key in its header; `body` as fetch takes it (a string, a FormData, a
// File). The answer is the response itself, or an ApiError for a status that is not 2xx.
export async function send(path, { method = "GET", body, headers = {}, signal } = {}) {
  needKey();
  const response = await fetch(path, { method, headers: authHeaders(headers), body, signal });
  if (!response.ok) await answer(response);
  return response;
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const json = body === undefined ? {} : { "Content-Type": "application/json" };
  const response = await send(path, {
    method,
    headers: json,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  return answer(response);
}

// A multipart form posted to `path` (an upload): the answer's JSON.
export async function postForm(path, form) {
  return answer(await send(path, { method: "POST", body: form }));
}

// An image (a File or Blob) stored with POST /v1/uploads as a multipart form. A refusal
// (422 not an image, 413 too large, 415) is an ApiError naming `field`, the job's field
// the image is for, so it is shown beside it as a job's 422 would be.
export async function upload(image, field, filename = "image.png") {
  const form = new FormData();
  form.append("file", image, filename);
  try {
    return await postForm("/v1/uploads", form);
  } catch (error) {
    if (!(error instanceof ApiError) || ![413, 415, 422].includes(error.status)) throw error;
    const files = (error.body && error.body.errors && error.body.errors.files) || {};
    const messages = files.file || [error.message];
    throw new ApiError(error.status, { ...error.body, errors: { json: { [field]: messages } } });
  }
}

async function answer(response) {
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, data, response.headers.get("Retry-After"));
  }
  return data;
}
