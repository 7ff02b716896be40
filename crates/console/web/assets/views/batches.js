// Batches (OpenAI's Batch API): the list, newest first with paging and a progress bar per batch,
// and one batch's page: its times, counts, the errors of a refused input, Cancel (after a
// confirmation) and the downloads of its files (fetched with the token, saved from a Blob).
// Both refresh every 2 s while a batch they show is unfinished.
import { api, download } from "../api.js";
import { h, note, replace, time, bytes, badge } from "../dom.js";
import { confirmDialog } from "../confirm.js";

/** Statuses a batch leaves by itself: while one is shown, the view keeps refreshing. */
export const UNFINISHED = new Set(["validating", "in_progress", "finalizing", "cancelling"]);
const CANCELLABLE = new Set(["validating", "in_progress"]);
const EVERY_MS = 2000;
/** With every batch shown finished, the list still looks for new ones, less often. */
const IDLE_MS = 10000;
const PAGE = 20;

export const batchHref = (id) => `/console/batches/${encodeURIComponent(id)}`;

/** A batch's progress: a <progress> of its finished lines (completed + failed) of the total. */
function progress(batch, id) {
  const counts = batch.request_counts ?? { total: 0, completed: 0, failed: 0 };
  const done = counts.completed + counts.failed;
  const label = `${done}/${counts.total}`;
  return h("span", { class: "progress", "data-done": String(done), "data-total": String(counts.total) },
    h("progress", { id, max: String(Math.max(counts.total, 1)), value: String(done),
      "aria-label": `${label} lines finished` }),
    h("span", { class: "num" }, label));
}

export function render(main, ctx, args, params) {
  if (args.length > 0) return batchPage(main, ctx, args[0]);
  return batchList(main, ctx, params);
}

function batchList(main, ctx, params) {
  const pages = [params.get("after") ?? ""];
  const body = h("tbody", { id: "batches-body" });
  const table = h("table", { class: "batches", id: "batches-table" },
    h("caption", { class: "sr-only" }, "Batches, newest first"),
    h("thead", {}, h("tr", {},
      ["Batch", "Status", "Endpoint", "Progress", "Failed", "Created", "Ended"]
        .map((c) => h("th", { scope: "col" }, c)))),
    body);
  const newer = h("button", { type: "button", id: "batches-newer" }, "← Newer");
  const older = h("button", { type: "button", id: "batches-older" }, "Older →");
  const live = h("span", { class: "muted", "aria-live": "polite" });
  const status = h("div");
  main.append(h("h1", {}, "Batches"),
    h("p", { class: "muted" }, "Batches of requests read from an uploaded JSONL file (",
      h("code", {}, "POST /v1/files"), ", then ", h("code", {}, "POST /v1/batches"),
      "); each line runs as a task."),
    h("div", { class: "scroll" }, table),
    h("div", { class: "pager" }, newer, older, live), status);

  let timer = null;
  let stopped = false;
  let lastPage = null;

  async function load() {
    clearTimeout(timer);
    const q = new URLSearchParams({ limit: String(PAGE) });
    const after = pages[pages.length - 1];
    if (after) q.set("after", after);
    let busy = false;
    try {
      lastPage = await api(`/v1/batches?${q}`);
      if (stopped) return;
      busy = lastPage.data.some((b) => UNFINISHED.has(b.status));
      replace(body, lastPage.data.length === 0
        ? h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No batches."))
        : lastPage.data.map((b) => h("tr", { "data-batch": b.id, "data-status": b.status },
          h("td", {}, h("a", { href: batchHref(b.id) }, h("code", {}, b.id))),
          h("td", {}, badge(b.status)),
          h("td", {}, h("code", {}, b.endpoint)),
          h("td", {}, progress(b)),
          h("td", { class: "num" }, String(b.request_counts?.failed ?? 0)),
          h("td", {}, time(b.created_at)),
          h("td", {}, time(b.completed_at ?? b.failed_at ?? b.cancelled_at ?? b.expired_at)))));
      newer.disabled = pages.length <= 1 && !pages[0];
      older.disabled = !lastPage.has_more;
      live.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
      status.replaceChildren();
    } catch (error) {
      if (stopped) return;
      busy = true;
      replace(status, note("error", `Could not list batches: ${error.message}`));
    }
    if (!stopped) timer = setTimeout(load, busy ? EVERY_MS : IDLE_MS);
  }

  function syncUrl() {
    const after = pages[pages.length - 1];
    history.replaceState(null, "", `/console/batches${after ? `?after=${encodeURIComponent(after)}` : ""}`);
  }

  older.addEventListener("click", () => {
    if (!lastPage?.has_more || lastPage.data.length === 0) return;
    pages.push(lastPage.data[lastPage.data.length - 1].id);
    syncUrl();
    load();
  });
  newer.addEventListener("click", () => {
    if (pages.length > 1) pages.pop(); else pages[0] = "";
    syncUrl();
    load();
  });
  load();
  return () => { stopped = true; clearTimeout(timer); };
}

function batchPage(main, ctx, batchId) {
  const controller = new AbortController();
  const signal = controller.signal;
  const stateBadge = h("span", { id: "batch-status" });
  const live = h("span", { class: "muted", "aria-live": "polite" });
  const messages = h("div", { "aria-live": "polite" });
  const head = h("dl", { class: "kv", id: "batch-head" });
  const counts = h("div", { id: "batch-counts" });
  const cancel = h("button", { type: "button", id: "batch-cancel", class: "danger", hidden: true }, "Cancel batch");
  const getOutput = h("button", { type: "button", id: "download-output", hidden: true }, "Download output");
  const getErrors = h("button", { type: "button", id: "download-errors", hidden: true }, "Download errors");
  const getInput = h("button", { type: "button", id: "download-input", hidden: true }, "Download input");
  const errorBox = h("div", { id: "batch-errors" });
  const files = h("dl", { class: "kv", id: "batch-files" });
  main.append(
    h("p", {}, h("a", { href: "/console/batches" }, "← All batches")),
    h("div", { class: "titlebar" },
      h("h1", {}, "Batch ", h("code", { id: "batch-id" }, batchId)), stateBadge, live),
    messages,
    h("div", { class: "grid" },
      h("section", { class: "card", "aria-labelledby": "batch-details-h" },
        h("h2", { id: "batch-details-h" }, "Details"), head),
      h("section", { class: "card", "aria-labelledby": "batch-progress-h" },
        h("h2", { id: "batch-progress-h" }, "Lines"), counts,
        h("h2", { class: "spaced" }, "Files"), files,
        h("div", { class: "actions" }, cancel, getOutput, getErrors, getInput))),
    errorBox);

  let batch = null;
  let timer = null;
  // The file objects already read (their names and sizes do not change).
  const known = new Map();

  function fileRow(label, id) {
    if (!id) return [h("dt", {}, label), h("dd", {}, "—")];
    const file = known.get(id);
    return [h("dt", {}, label), h("dd", { "data-file": id }, h("code", {}, id),
      file ? h("span", { class: "muted" }, ` ${file.filename} · ${bytes(file.bytes)}`) : null)];
  }

  function showFiles() {
    replace(files,
      fileRow("input", batch.input_file_id),
      fileRow("output", batch.output_file_id),
      fileRow("errors", batch.error_file_id));
  }

  async function readFiles() {
    const ids = [batch.input_file_id, batch.output_file_id, batch.error_file_id]
      .filter((id) => id && !known.has(id));
    for (const id of ids) {
      try {
        known.set(id, await api(`/v1/files/${encodeURIComponent(id)}`, { signal }));
      } catch {
        // The file may be gone (deleted, or past the retention): its id stays shown.
      }
    }
    if (ids.length && !signal.aborted) showFiles();
  }

  function showBatch(b) {
    batch = b;
    replace(stateBadge, badge(b.status));
    stateBadge.dataset.status = b.status;
    const at = (label, value) => (value === null || value === undefined ? null
      : [h("dt", {}, label), h("dd", {}, time(value))]);
    replace(head,
      h("dt", {}, "endpoint"), h("dd", { id: "batch-endpoint" }, h("code", {}, b.endpoint)),
      h("dt", {}, "window"), h("dd", {}, b.completion_window ?? "—"),
      at("created", b.created_at),
      at("in progress", b.in_progress_at),
      at("finalizing", b.finalizing_at),
      at("completed", b.completed_at),
      at("failed", b.failed_at),
      at("cancelling", b.cancelling_at),
      at("cancelled", b.cancelled_at),
      at("expired", b.expired_at),
      at("expires", UNFINISHED.has(b.status) ? b.expires_at : null),
      Object.keys(b.metadata ?? {}).length
        ? [h("dt", {}, "metadata"), h("dd", {}, h("code", {}, JSON.stringify(b.metadata)))] : null);
    const c = b.request_counts ?? { total: 0, completed: 0, failed: 0 };
    replace(counts,
      progress(b, "batch-progress"),
      h("dl", { class: "kv" },
        h("dt", {}, "total"), h("dd", { id: "count-total", class: "num" }, String(c.total)),
        h("dt", {}, "completed"), h("dd", { id: "count-completed", class: "num" }, String(c.completed)),
        h("dt", {}, "failed"), h("dd", { id: "count-failed", class: "num" }, String(c.failed))));
    showFiles();
    cancel.hidden = !(ctx.can("responses:write") && CANCELLABLE.has(b.status));
    getOutput.hidden = !b.output_file_id;
    getErrors.hidden = !b.error_file_id;
    getInput.hidden = !b.input_file_id;
    const errors = b.errors?.data ?? [];
    replace(errorBox, errors.length === 0 ? null
      : h("section", { class: "card error", role: "alert", "aria-labelledby": "batch-errors-h" },
        h("h2", { id: "batch-errors-h" }, `Errors (${errors.length})`),
        h("div", { class: "scroll" }, h("table", { id: "batch-errors-table" },
          h("thead", {}, h("tr", {}, ["Line", "Code", "Param", "Message"]
            .map((col) => h("th", { scope: "col" }, col)))),
          h("tbody", {}, errors.map((e) => h("tr", {},
            h("td", { class: "num" }, e.line === null || e.line === undefined ? "—" : String(e.line)),
            h("td", {}, h("code", {}, e.code ?? "")),
            h("td", {}, e.param ? h("code", {}, e.param) : "—"),
            h("td", {}, e.message ?? ""))))))));
    readFiles();
  }

  async function load() {
    clearTimeout(timer);
    try {
      showBatch(await api(`/v1/batches/${encodeURIComponent(batchId)}`, { signal }));
      live.textContent = UNFINISHED.has(batch.status)
        ? `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}` : "";
    } catch (error) {
      if (signal.aborted) return;
      replace(messages, note("error", error.status === 404
        ? "No such batch (or not yours)." : `Could not read the batch: ${error.message}`));
      if (error.status === 404) return;
    }
    if (!signal.aborted && (!batch || UNFINISHED.has(batch.status))) timer = setTimeout(load, EVERY_MS);
  }

  cancel.addEventListener("click", async () => {
    const yes = await confirmDialog(
      `Cancel batch ${batchId}? Its queued lines are cancelled; finished lines are kept in its files.`,
      "Cancel batch");
    if (!yes) { cancel.focus(); return; }
    cancel.disabled = true;
    try {
      showBatch(await api(`/v1/batches/${encodeURIComponent(batchId)}/cancel`, { method: "POST" }));
      replace(messages, note("info", "Cancel requested."));
    } catch (error) {
      replace(messages, note("error", `Cancel failed: ${error.message}`));
    } finally {
      cancel.disabled = false;
    }
    load();
  });

  const saver = (button, which, suffix) => button.addEventListener("click", async () => {
    const id = batch?.[which];
    if (!id) return;
    button.disabled = true;
    try {
      const size = await download(`/v1/files/${encodeURIComponent(id)}/content`, `${batchId}_${suffix}.jsonl`);
      replace(messages, note("ok", `Saved ${batchId}_${suffix}.jsonl (${bytes(size)}).`));
    } catch (error) {
      replace(messages, note("error", `Download failed: ${error.message}`));
    } finally {
      button.disabled = false;
    }
  });
  saver(getOutput, "output_file_id", "output");
  saver(getErrors, "error_file_id", "errors");
  saver(getInput, "input_file_id", "input");

  load();
  return () => { controller.abort(); clearTimeout(timer); };
}
