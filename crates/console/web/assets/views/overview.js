// Overview: the service, its store and engine health, tasks by status (live) and three small
// charts.
import { api } from "../api.js";
import { h, note, replace, time, duration, badge } from "../dom.js";
import { chart } from "../chart.js";

const STATUSES = ["queued", "loading", "running", "cancelling", "completed", "failed", "cancelled"];
const SAMPLES = 60;
const EVERY_MS = 2000;

/** Parses the Prometheus text of GET /metrics into {name{labels}: value}. */
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const space = line.lastIndexOf(" ");
    const value = Number(line.slice(space + 1));
    if (!Number.isNaN(value)) out.set(line.slice(0, space), value);
  }
  return out;
}

/** The engine line: its kind, a status badge and why it is unavailable. */
function showEngine(el, engine) {
  if (!engine) {
    replace(el, "—");
    delete el.dataset.status;
    return;
  }
  el.dataset.status = engine.status;
  el.dataset.kind = engine.kind;
  replace(el, h("code", {}, engine.kind), " ", badge(engine.status),
    engine.detail ? h("span", { class: "muted" }, ` ${engine.detail}`) : null);
}

export function render(main, ctx) {
  const service = ctx.service;
  const health = h("span", {}, "…");
  const engine = h("span", { id: "engine-health" });
  showEngine(engine, service.engine);
  const counts = h("div", { class: "counts", id: "counts" });
  const countsNote = h("p", { class: "muted" });
  const charts = h("div", { class: "charts" });
  const status = h("div", { "aria-live": "polite" });
  main.append(
    h("h1", {}, "Overview"),
    h("div", { class: "grid" },
      h("section", { class: "card", "aria-labelledby": "svc-h" },
        h("h2", { id: "svc-h" }, "Service"),
        h("dl", { class: "kv" },
          h("dt", {}, "id"), h("dd", { id: "service-id" }, h("code", {}, service.id)),
          h("dt", {}, "spec"), h("dd", {}, service.spec),
          h("dt", {}, "version"), h("dd", { id: "service-version" }, service.version),
          h("dt", {}, "started"), h("dd", {}, time(service.started_at)),
          h("dt", {}, "retention"), h("dd", {}, duration(service.retention_seconds)),
          h("dt", {}, "default on_restart"), h("dd", {}, service.default_on_restart),
          h("dt", {}, "store health"), h("dd", { id: "health" }, health),
          h("dt", {}, "engine"), h("dd", {}, engine))),
      h("section", { class: "card", "aria-labelledby": "counts-h" },
        h("h2", { id: "counts-h" }, "Tasks by status"), counts, countsNote)),
    h("section", { class: "card", "aria-labelledby": "charts-h" },
      h("h2", { id: "charts-h" }, "Activity"), charts,
      h("p", { class: "muted" }, ctx.can("admin")
        ? `From GET /metrics every ${EVERY_MS / 1000} s while this page is open.`
        : "From the newest 100 tasks you can see, by minute (GET /metrics needs admin).")),
    status);

  const samples = [];
  let timer = null;
  let stopped = false;

  function showCounts(byStatus, partial) {
    replace(counts, STATUSES.map((st) => h("div", { class: "count", "data-status": st },
      badge(st), h("span", { class: "n" }, String(byStatus[st] ?? 0)))));
    countsNote.textContent = partial ? "Counted over the newest 100 tasks visible to this token." : "";
  }

  async function pollAdmin() {
    const metrics = parseMetrics(await api("/metrics"));
    const byStatus = {};
    for (const st of STATUSES) byStatus[st] = metrics.get(`lmsp_tasks{status="${st}"}`) ?? 0;
    showCounts(byStatus, false);
    let finished = 0;
    for (const [key, value] of metrics) if (key.startsWith("lmsp_tasks_finished_total")) finished += value;
    samples.push({ at: Date.now(), submitted: metrics.get("lmsp_tasks_submitted_total") ?? 0,
      finished, queued: byStatus.queued });
    if (samples.length > SAMPLES + 1) samples.shift();
    const rate = (key) => samples.slice(1).map((sample, i) => {
      const before = samples[i];
      const minutes = (sample.at - before.at) / 60000;
      return minutes > 0 ? Math.max(0, sample[key] - before[key]) / minutes : 0;
    });
    replace(charts,
      chart("Submits / min", rate("submitted")),
      chart("Completions / min", rate("finished")),
      chart("Queue depth", samples.map((sample) => sample.queued)));
  }

  async function pollTasks() {
    const page = await api("/v1/tasks?limit=100");
    const byStatus = {};
    for (const t of page.data) byStatus[t.status] = (byStatus[t.status] ?? 0) + 1;
    showCounts(byStatus, true);
    const now = Date.now();
    const buckets = (field) => {
      const out = new Array(30).fill(0);
      for (const t of page.data) {
        if (!t[field]) continue;
        const ago = Math.floor((now - new Date(t[field]).getTime()) / 60000);
        if (ago >= 0 && ago < 30) out[29 - ago] += 1;
      }
      return out;
    };
    samples.push({ queued: byStatus.queued ?? 0 });
    if (samples.length > SAMPLES) samples.shift();
    replace(charts,
      chart("Submits / min", buckets("created_at")),
      chart("Completions / min", buckets("finished_at")),
      chart("Queue depth", samples.map((sample) => sample.queued)));
  }

  async function tick() {
    try {
      const reply = await fetch("/v1/health", { cache: "no-store", credentials: "omit" });
      const body = await reply.json().catch(() => ({}));
      replace(health, reply.ok ? badge("ok") : badge("unavailable"),
        reply.ok ? "" : ` ${body.reason ?? ""}`);
      const now = await api("/v1/service");
      ctx.service = now;
      showEngine(engine, now.engine);
      if (ctx.can("admin")) await pollAdmin();
      else if (ctx.can("responses:read")) await pollTasks();
      else countsNote.textContent = "This token cannot read tasks.";
      status.replaceChildren();
    } catch (error) {
      replace(status, note("error", `Refresh failed: ${error.message}`));
    }
    if (!stopped) timer = setTimeout(tick, EVERY_MS);
  }
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}
