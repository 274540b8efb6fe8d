// A job's Server-Sent Events read with fetch, so the key travels in a header.
import { ApiError, authHeaders } from "./api.js";

const RECONNECT_MS = 2000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function parse(block) {
  const event = { name: "message", id: null, data: null };
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event.name = value;
    else if (field === "id") event.id = value;
    else if (field === "data") event.data = event.data === null ? value : `${event.data}\n${value}`;
  }
  return event;
}

// Calls onEvent(name, data) until it returns true (the job finished) or `signal` aborts;
// a dropped connection is resumed with Last-Event-ID.
export async function follow(url, onEvent, signal) {
  let lastId = null;
  while (!signal.aborted) {
    const headers = authHeaders({ Accept: "text/event-stream" });
    if (lastId !== null) headers["Last-Event-ID"] = lastId;
    let response;
    try {
      response = await fetch(url, { headers, signal, cache: "no-store" });
    } catch {
      if (signal.aborted) return;
      await sleep(RECONNECT_MS);
      continue;
    }
    if (response.status === 204) return;
    if (!response.ok) {
      let body = null;
      try {
        body = await response.json();
      } catch {
        body = null;
      }
      throw new ApiError(response.status, body, response.headers.get("Retry-After"));
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = parse(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (event.id !== null) lastId = event.id;
          if (event.data !== null && onEvent(event.name, JSON.parse(event.data))) {
            reader.cancel().catch(() => {});
            return;
          }
        }
      }
    } catch {
      if (signal.aborted) return;
    }
    await sleep(RECONNECT_MS);
  }
}
