// One task: its details, the timeline of its events, its output growing live from the stream
// (resumed by sequence number after a drop), its error, Cancel (after a confirmation), and its
// response JSON.
import { api, followEvents } from "../api.js";
import { h, note, replace, time, badge } from "../dom.js";
import { confirmDialog } from "../confirm.js";

const UNFINISHED = new Set(["queued", "loading", "running", "cancelling"]);
const QUIET = new Set([
  "response.output_text.delta", "response.content_part.added", "response.content_part.done",
  "response.output_text.done",
]);

/** Renders a live task panel into `container`; returns its cleanup. */
export function taskPanel(container, ctx, taskId) {
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
      h("dt", {}, "response"), h("dd", {}, h("code", {}, `/v1/responses/${t.response_id}`)),
      Object.keys(t.metadata ?? {}).length
        ? [h("dt", {}, "metadata"), h("dd", {}, h("code", {}, JSON.stringify(t.metadata)))] : null);
    cancel.hidden = !(ctx.can("responses:write") && UNFINISHED.has(t.status) && t.status !== "cancelling");
    if (t.error) {
      replace(errorBox, h("section", { class: "card error", role: "alert" },
        h("h2", {}, "Error"), h("p", {}, h("code", {}, t.error.code), " ", t.error.message)));
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
  return taskPanel(main, ctx, taskId);
}
