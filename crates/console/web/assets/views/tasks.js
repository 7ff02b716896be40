// Tasks: a table with status/model/client filters, newest first, paging with `after`, live.
import { api } from "../api.js";
import { h, note, replace, time, badge } from "../dom.js";

const STATUSES = ["queued", "loading", "running", "cancelling", "completed", "failed", "cancelled"];
const EVERY_MS = 2000;
const PAGE = 20;

export function render(main, ctx, _args, params) {
  const filters = {
    status: params.get("status") ?? "",
    model: params.get("model") ?? "",
    client_id: params.get("client_id") ?? "",
  };
  // The ids where each page started: the last entry is the current page's `after`.
  const pages = [params.get("after") ?? ""];

  const statusSelect = h("select", { id: "f-status", name: "status" },
    h("option", { value: "" }, "any"),
    h("option", { value: "queued,loading,running,cancelling" }, "unfinished"),
    STATUSES.map((st) => h("option", { value: st }, st)));
  statusSelect.value = filters.status;
  const modelInput = h("input", { id: "f-model", name: "model", list: "f-models", value: filters.model,
    placeholder: "any", autocomplete: "off" });
  const modelList = h("datalist", { id: "f-models" });
  const clientInput = h("select", { id: "f-client", name: "client_id" }, h("option", { value: "" }, "any"));
  const form = h("form", { class: "filters", "aria-label": "Filters" },
    h("label", {}, "Status ", statusSelect),
    h("label", {}, "Model ", modelInput, modelList),
    ctx.can("admin") ? h("label", {}, "Client ", clientInput) : null,
    h("button", { type: "submit" }, "Filter"));
  const body = h("tbody", { id: "tasks-body" });
  const table = h("table", { class: "tasks", id: "tasks-table" },
    h("caption", { class: "sr-only" }, "Tasks, newest first"),
    h("thead", {}, h("tr", {},
      ["Task", "Status", "Model", "Created", "Finished", "Restarts"].map((c) => h("th", { scope: "col" }, c)))),
    body);
  const newer = h("button", { type: "button", id: "page-newer" }, "← Newer");
  const older = h("button", { type: "button", id: "page-older" }, "Older →");
  const live = h("span", { class: "muted", "aria-live": "polite" });
  const status = h("div");
  main.append(h("h1", {}, "Tasks"), form,
    h("div", { class: "scroll" }, table),
    h("div", { class: "pager" }, newer, older, live), status);

  if (ctx.can("models:read")) {
    api("/v1/models").then((list) => replace(modelList,
      list.data.map((m) => h("option", { value: m.id })))).catch(() => {});
  }
  if (ctx.can("admin")) {
    api("/v1/clients").then((list) => {
      clientInput.append(...list.data.map((c) => h("option", { value: c.id }, `${c.name} (${c.id})`)));
      clientInput.value = filters.client_id;
    }).catch(() => {});
  }

  let timer = null;
  let stopped = false;
  let lastPage = null;

  function query() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    return q;
  }

  async function load() {
    clearTimeout(timer);
    const q = query();
    q.set("limit", String(PAGE));
    const after = pages[pages.length - 1];
    if (after) q.set("after", after);
    try {
      lastPage = await api(`/v1/tasks?${q}`);
      if (stopped) return;
      replace(body, lastPage.data.length === 0
        ? h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No tasks."))
        : lastPage.data.map((t) => h("tr", { "data-task": t.id },
          h("td", {}, h("a", { href: `/console/tasks/${encodeURIComponent(t.id)}` }, h("code", {}, t.id))),
          h("td", {}, badge(t.status)),
          h("td", {}, t.model),
          h("td", {}, time(t.created_at)),
          h("td", {}, time(t.finished_at)),
          h("td", { class: "num" }, String(t.restarts)))));
      newer.disabled = pages.length <= 1 && !pages[0];
      older.disabled = !lastPage.has_more;
      live.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
      status.replaceChildren();
    } catch (error) {
      replace(status, note("error", `Could not list tasks: ${error.message}`));
    }
    if (!stopped) timer = setTimeout(load, EVERY_MS);
  }

  function syncUrl() {
    const q = query();
    const after = pages[pages.length - 1];
    if (after) q.set("after", after);
    const search = q.toString();
    history.replaceState(null, "", `/console/tasks${search ? `?${search}` : ""}`);
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    filters.status = statusSelect.value;
    filters.model = modelInput.value.trim();
    filters.client_id = ctx.can("admin") ? clientInput.value : "";
    pages.length = 0;
    pages.push("");
    syncUrl();
    load();
  });
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
