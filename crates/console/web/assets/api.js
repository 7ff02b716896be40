// The console's only way to the service: the public HTTP API, with the pasted token as
// `Authorization: Bearer`. The token lives in sessionStorage (this tab only, gone when it
// closes): never in a URL, a cookie or localStorage.

const KEY = "lmsp.console.token";

export const session = {
  token: () => sessionStorage.getItem(KEY),
  save: (token) => sessionStorage.setItem(KEY, token),
  clear: () => sessionStorage.removeItem(KEY),
};

/** An API error: the HTTP status and the envelope's code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let onUnauthorized = () => {};
/** What to do when a call answers 401 (the token is unknown or was revoked). */
export function whenUnauthorized(callback) { onUnauthorized = callback; }

function headers(extra) {
  const out = { ...extra };
  const token = session.token();
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

async function failure(response) {
  let envelope = null;
  try { envelope = await response.json(); } catch { envelope = null; }
  const error = envelope?.error ?? {};
  return new ApiError(response.status, error.code ?? `http_${response.status}`,
    error.message ?? response.statusText ?? "request failed");
}

/**
 * Calls the API: JSON in (when `body` is given), JSON or text out, null for a 204.
 * A non-2xx reply throws an ApiError.
 */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = {
    method,
    headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  };
  const response = await fetch(path, init);
  if (!response.ok) {
    const error = await failure(response);
    if (response.status === 401) onUnauthorized(error);
    throw error;
  }
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") ?? "";
  return type.includes("json") ? response.json() : response.text();
}

const TERMINAL = new Set(["response.completed", "response.failed", "response.cancelled"]);
export const isTerminal = (type) => TERMINAL.has(type);

/** Splits a Server-Sent Events text into frames; returns [frames, rest]. */
function frames(buffer) {
  const out = [];
  const normal = buffer.replace(/\r\n?/g, "\n");
  const parts = normal.split("\n\n");
  const rest = parts.pop();
  for (const part of parts) {
    const frame = { id: null, event: null, data: [] };
    for (const line of part.split("\n")) {
      if (line === "" || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon === -1 ? line : line.slice(0, colon);
      let value = colon === -1 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") frame.data.push(value);
      else if (field === "id") frame.id = value;
      else if (field === "event") frame.event = value;
    }
    if (frame.data.length > 0) out.push(frame);
  }
  return [out, rest];
}

/**
 * Follows a task's event log: `onEvent(event)` for each event after `after`, in order, exactly
 * once, until the terminal event. The stream is read with fetch and a ReadableStream (an
 * EventSource cannot send the Authorization header); when the connection drops it reconnects
 * with the last sequence number it saw (`after`), with a growing pause, and tells
 * `onState("reconnecting" | "live" | "done")`. Stops when `signal` aborts.
 */
export async function followEvents(taskId, { after = 0, signal, onEvent, onState = () => {} }) {
  let last = after;
  let pause = 250;
  while (!signal?.aborted) {
    let ended = false;
    try {
      const url = `/v1/tasks/${encodeURIComponent(taskId)}/events?stream=true&after=${last}`;
      const response = await fetch(url, {
        headers: headers({ Accept: "text/event-stream" }),
        cache: "no-store", credentials: "omit", signal,
      });
      if (!response.ok) {
        const error = await failure(response);
        if (response.status === 401) onUnauthorized(error);
        if (response.status < 500 && response.status !== 429) throw error;
        throw Object.assign(error, { retry: true });
      }
      onState("live");
      pause = 250;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        const [ready, rest] = frames(buffer);
        buffer = rest;
        for (const frame of ready) {
          const event = JSON.parse(frame.data.join("\n"));
          if (typeof event.sequence_number !== "number" || event.sequence_number <= last) continue;
          last = event.sequence_number;
          onEvent(event);
          if (isTerminal(event.type)) ended = true;
        }
        if (ended) { await reader.cancel().catch(() => {}); break; }
      }
    } catch (error) {
      if (signal?.aborted) return last;
      if (error instanceof ApiError && !error.retry) throw error;
    }
    if (ended) { onState("done"); return last; }
    if (signal?.aborted) return last;
    onState("reconnecting");
    await new Promise((resolve) => { setTimeout(resolve, pause); });
    pause = Math.min(pause * 2, 5000);
  }
  return last;
}

/**
 * Downloads a file of the API (e.g. `/v1/files/{id}/content`) with the token and saves it under
 * `filename`: the bytes are fetched with the Authorization header (a plain link could not send
 * it), then handed to the browser as a Blob through a temporary object URL.
 */
export async function download(path, filename) {
  const response = await fetch(path, {
    headers: headers(), cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
  });
  if (!response.ok) {
    const error = await failure(response);
    if (response.status === 401) onUnauthorized(error);
    throw error;
  }
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
  return blob.size;
}

/** Every page of a list, following `after` (bounded). */
export async function listAll(path, max = 1000) {
  const out = [];
  let after = null;
  for (;;) {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(after ? `${path}${sep}after=${encodeURIComponent(after)}` : path);
    out.push(...page.data);
    if (!page.has_more || page.data.length === 0 || out.length >= max) return out;
    after = page.data[page.data.length - 1].id;
  }
}
