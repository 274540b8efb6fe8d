// The API, called with the key kept in this browser's storage (never in a URL).
const KEY_NAME = "diffq.apiKey";

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

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = authHeaders(body === undefined ? {} : { "Content-Type": "application/json" });
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
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
