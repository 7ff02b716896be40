// One task: its details (with its batch and custom_id when a batch line made it), its input, the
// timeline of its events, its output growing live from the stream (resumed by sequence number
// after a drop), its error, Cancel (after a confirmation), and its response JSON.
import { api, listAll, followEvents } from "../api.js";
import { h, note, replace, time, badge } from "../dom.js";
import { confirmDialog } from "../confirm.js";
import { batchHref } from "./batches.js";

const UNFINISHED = new Set(["queued", "loading", "running", "cancelling"]);
const QUIET = new Set([
  "response.output_text.delta", "response.content_part.added", "response.content_part.done",
  "response.output_text.done",
]);

/** The text of one content part of an input message. */
function partText(part) {
  if (typeof part === "string") return part;
  if (typeof part?.text === "string") return part.text;
  if (typeof part?.refusal === "string") return part.refusal;
  return `[${part?.type ?? "part"}]`;
}

/** One input item (OpenAI's shapes): a message's role and text, a function call or its output. */
function inputItem(item) {
  const type = item.type ?? "message";
  let label;
  let text;
  if (type === "message") {
    label = item.role ?? "message";
    text = typeof item.content === "string" ? item.content
      : (item.content ?? []).map(partText).join("\n");
  } else if (type === "function_call_output") {
    label = `function output${item.call_id ? ` · ${item.call_id}` : ""}`;
    text = typeof item.output === "string" ? item.output : JSON.stringify(item.output);
  } else if (type === "function_call") {
    label = `function call${item.name ? ` · ${item.name}` : ""}`;
    text = item.arguments ?? "";
  } else {
    label = type;
    text = JSON.stringify(item);
  }
  return h("li", { "data-type": type, "data-role": item.role ?? null },
    h("div", { class: "role" }, label),
    h("pre", { class: "output" }, text));
}

/**
 * Renders a live task panel into `container`; returns its cleanup. With `showInput`, the
 * request's input is shown too (`GET /v1/responses/{id}/input_items`).
 */
export function taskPanel(container, ctx, taskId, { showInput = false } = {}) {
  const controller = new AbortController();
  const head = h("dl", { class: "kv", id: "task-head" });
  const stateBadge = h("span", { id: "task-status" });
  const streamState = h("span", { id: "stream-state", class: "muted", "aria-live": "polite" });
  const cancel = h("button", { type: "button", id: "cancel", class: "danger", hidden: true }, "Cancel task");
  const showJson = h("button", { type: "button", id: "show-response" }, "Response JSON");
  const json = h("pre", { id: "response-json", class: "json", hidden: true, tabindex: "0" });
  const errorBox = h("div", { id: "task-error" });
  const timeline = h("ol", { id: "timeline", class: "timeline" });
  const output = h("pre", { id: "output", class: "output", "aria-live": "off", tabindex: "0" });
  const messages = h("div", { "aria-live": "polite" });
  const inputList = h("ol", { id: "task-input", class: "inputs" });
  const inputCard = showInput ? h("section", { class: "card", "aria-labelledby": "input-h" },
    h("h2", { id: "input-h" }, "Input"), inputList) : null;
  // "no" (not read yet), "reading", "retry" (to read again once the task has finished), "done".
  let inputState = showInput ? "no" : "done";
  let deltaCount = 0;
  const deltaNote = h("span", { class: "muted", id: "delta-count" });
  let task = null;

  container.append(
    h("div", { class: "titlebar" },
      h("h1", {}, "Task ", h("code", { id: "task-id" }, taskId)), stateBadge, streamState),
    messages,
    h("div", { class: "grid" },
      h("section", { class: "card", "aria-labelledby": "details-h" },
        h("h2", { id: "details-h" }, "Details"), head,
        h("div", { class: "actions" }, cancel, showJson)),
      h("section", { class: "card", "aria-labelledby": "timeline-h" },
        h("h2", { id: "timeline-h" }, "Timeline"), timeline, deltaNote)),
    errorBox,
    inputCard,
    h("section", { class: "card", "aria-labelledby": "output-h" },
      h("h2", { id: "output-h" }, "Output"), output),
    json);

  function showTask(t) {
    task = t;
    replace(stateBadge, badge(t.status));
    stateBadge.dataset.status = t.status;
    replace(head,
      h("dt", {}, "model"), h("dd", {}, t.model),
      h("dt", {}, "on_restart"), h("dd", {}, t.on_restart),
      h("dt", {}, "restarts"), h("dd", { id: "task-restarts" }, String(t.restarts)),
      h("dt", {}, "created"), h("dd", {}, time(t.created_at)),
      h("dt", {}, "started"), h("dd", {}, time(t.started_at)),
      h("dt", {}, "finished"), h("dd", {}, time(t.finished_at)),
      h("dt", {}, "events"), h("dd", {}, String(t.last_sequence_number)),
      t.batch_id ? [h("dt", {}, "batch"), h("dd", {},
        h("a", { id: "task-batch", href: batchHref(t.batch_id) }, h("code", {}, t.batch_id)))] : null,
      t.custom_id !== undefined && t.custom_id !== null
        ? [h("dt", {}, "custom_id"), h("dd", {}, h("code", { id: "task-custom-id" }, t.custom_id))] : null,
      h("dt", {}, "response"), h("dd", {}, h("code", {}, `/v1/responses/${t.response_id}`)),
      Object.keys(t.metadata ?? {}).length
        ? [h("dt", {}, "metadata"), h("dd", {}, h("code", {}, JSON.stringify(t.metadata)))] : null);
    cancel.hidden = !(ctx.can("responses:write") && UNFINISHED.has(t.status) && t.status !== "cancelling");
    if (t.error) {
      replace(errorBox, h("section", { class: "card error", role: "alert" },
        h("h2", {}, "Error"), h("p", {}, h("code", {}, t.error.code), " ", t.error.message)));
    }
    if (inputState === "no" || (inputState === "retry" && !UNFINISHED.has(t.status))) readInput(t);
  }

  async function readInput(t) {
    const unfinished = UNFINISHED.has(t.status);
    inputState = "reading";
    try {
      const items = await listAll(
        `/v1/responses/${encodeURIComponent(t.response_id)}/input_items?order=asc&limit=100`);
      if (controller.signal.aborted) return;
      replace(inputList, items.length === 0
        ? h("li", { class: "muted" }, "No input items.") : items.map(inputItem));
      inputState = "done";
    } catch (error) {
      if (controller.signal.aborted) return;
      inputState = unfinished ? "retry" : "done";
      replace(inputList, h("li", { class: "muted" }, `The input could not be read: ${error.message}`));
    }
  }

  // One read of the task at a time. An event that arrives while a read is under way may be
  // newer than what that read returns (a `cancelled` right after its `cancelling`), so it asks
  // for one more read once the current one is done, instead of sharing the stale one.
  let refreshing = null;
  let again = false;
  function refresh() {
    if (refreshing) {
      again = true;
      return refreshing;
    }
    refreshing = api(`/v1/tasks/${encodeURIComponent(taskId)}`, { signal: controller.signal })
      .then(showTask)
      .catch((error) => { if (!controller.signal.aborted) replace(messages, note("error", error.message)); })
      .finally(() => {
        refreshing = null;
        if (again && !controller.signal.aborted) {
          again = false;
          refresh();
        }
      });
    return refreshing;
  }

  function onEvent(event) {
    const type = event.type;
    if (type === "response.output_text.delta") {
      output.append(document.createTextNode(event.data?.delta ?? ""));
      deltaCount += 1;
      deltaNote.textContent = `${deltaCount} output deltas`;
      return;
    }
    if (type === "response.queued") {
      // A run after a requeue starts from nothing: its text replaces the earlier run's.
      output.replaceChildren();
    }
    if (!QUIET.has(type)) {
      const detail = [];
      if (type === "response.queued") detail.push(`reason: ${event.data?.reason ?? "?"}`);
      if (type === "response.resumed") detail.push(`from #${event.data?.from_sequence_number}`);
      if (type === "response.loading") detail.push(`model ${event.data?.model ?? ""}`);
      if (type === "response.failed") detail.push(`${event.data?.error?.code ?? ""}: ${event.data?.error?.message ?? ""}`);
      if (type === "response.output_item.done") detail.push(`status ${event.data?.status ?? ""}`);
      timeline.append(h("li", { "data-type": type, "data-seq": String(event.sequence_number) },
        h("span", { class: "seq" }, `#${event.sequence_number}`), " ",
        h("strong", {}, type.replace(/^response\./, "")), " ",
        h("time", { datetime: event.created_at }, time(event.created_at)),
        detail.length ? h("span", { class: "muted" }, ` — ${detail.join(", ")}`) : null));
      refresh();
    }
  }

  cancel.addEventListener("click", async () => {
    const yes = await confirmDialog(
      `Cancel task ${taskId}? Its output so far is kept; the task does not run again.`, "Cancel task");
    if (!yes) { cancel.focus(); return; }
    cancel.disabled = true;
    try {
      showTask(await api(`/v1/tasks/${encodeURIComponent(taskId)}/cancel`, { method: "POST" }));
      replace(messages, note("info", "Cancel requested."));
    } catch (error) {
      replace(messages, note("error", `Cancel failed: ${error.message}`));
    } finally {
      cancel.disabled = false;
    }
  });

  showJson.addEventListener("click", async () => {
    if (!json.hidden) { json.hidden = true; return; }
    try {
      const response = await api(`/v1/responses/${encodeURIComponent(task.response_id)}`);
      json.textContent = JSON.stringify(response, null, 2);
      json.hidden = false;
    } catch (error) {
      replace(messages, note("error", `Could not load the response: ${error.message}`));
    }
  });

  refresh().then(() => {
    if (!task) return;
    followEvents(taskId, {
      after: 0,
      signal: controller.signal,
      onEvent,
      onState: (state) => {
        streamState.dataset.state = state;
        streamState.textContent = state === "live" ? "● live" : state === "reconnecting" ? "reconnecting…" : "";
      },
    }).catch((error) => {
      if (!controller.signal.aborted) replace(messages, note("error", `Stream: ${error.message}`));
    });
  });

  return () => controller.abort();
}

export function render(main, ctx, [taskId]) {
  main.append(h("p", {}, h("a", { href: "/console/tasks" }, "← All tasks")));
  return taskPanel(main, ctx, taskId, { showInput: true });
}
