// Webhooks (admin): the endpoints the service posts events to, newest first, and a form to
// register one; an endpoint's page: its details, edit, send a test event, rotate its signing
// secret, delete it (after a confirmation), and its deliveries, refreshed every 2 s while one is
// pending. A signing secret is shown once (on registration and on rotation), with a copy button.
import { api, listAll } from "../api.js";
import { h, note, replace, time, badge } from "../dom.js";
import { confirmDialog } from "../confirm.js";
import { batchHref } from "./batches.js";

/** The event types an endpoint may subscribe to (`response.incomplete` is never sent). */
export const EVENT_TYPES = [
  "response.completed", "response.failed", "response.cancelled", "response.incomplete",
  "batch.completed", "batch.failed", "batch.cancelled", "batch.expired",
];
const DEFAULT_TYPES = ["response.completed", "batch.completed"];
/** While a delivery is pending its table refreshes this often; otherwise less often. */
const EVERY_MS = 2000;
const IDLE_MS = 10000;
const DELIVERIES = 50;

export const webhookHref = (id) => `/console/webhooks/${encodeURIComponent(id)}`;

/**
 * The console page of a delivery's subject: a response's task (`task_` + the ULID of its
 * `resp_…`) or a batch.
 */
export function subjectHref(subjectId) {
  const response = /^resp_([0-9A-Za-z]+)$/.exec(subjectId ?? "");
  if (response) return `/console/tasks/${encodeURIComponent(`task_${response[1]}`)}`;
  if (/^batch_[0-9A-Za-z]+$/.test(subjectId ?? "")) return batchHref(subjectId);
  return null;
}

/** A message for the list page after an endpoint's page navigated there (e.g. a deletion). */
let flash = null;

/** The event-type checkboxes of a form; `values()` reads them, `set(types)` ticks them. */
function eventBoxes(prefix, checked) {
  const boxes = EVENT_TYPES.map((type) => h("input", {
    type: "checkbox", name: "event_type", value: type,
    id: `${prefix}-${type.replace(".", "-")}`, checked: checked.includes(type),
  }));
  const fieldset = h("fieldset", { id: `${prefix}-events` },
    h("legend", {}, "Event types"),
    boxes.map((box) => h("label", { class: "check", for: box.id }, box, ` ${box.value}`)),
    h("p", { class: "muted hint" },
      "response.* events are sent when a background response ends; response.incomplete is accepted but never sent."));
  return {
    fieldset,
    values: () => boxes.filter((box) => box.checked).map((box) => box.value),
    set(types) { for (const box of boxes) box.checked = types.includes(box.value); },
  };
}

/**
 * A signing secret, shown once: a marked box with the value, a Copy button and the warning that
 * it is not shown again. The Copy button gets the focus.
 */
function secretBox(slot, secret, title) {
  const value = h("code", { id: "webhook-secret", class: "secret-value", tabindex: "0" }, secret);
  const copy = h("button", { type: "button", id: "copy-secret" }, "Copy");
  const copied = h("span", { id: "copy-status", class: "muted", "aria-live": "polite" });
  copy.addEventListener("click", async () => {
    try {
      if (!navigator.clipboard) throw new Error("no clipboard");
      await navigator.clipboard.writeText(secret);
      copied.textContent = "Copied to the clipboard.";
    } catch {
      // No clipboard (not a secure context, or refused): select it for Ctrl+C instead.
      const range = document.createRange();
      range.selectNodeContents(value);
      const selection = getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      copied.textContent = "Could not copy: the secret is selected, copy it with Ctrl+C.";
    }
  });
  replace(slot, h("section", { class: "card secret", id: "secret-box", "aria-labelledby": "secret-h" },
    h("h2", { id: "secret-h" }, title),
    h("p", { class: "warn", id: "secret-warning" },
      "Copy it now and keep it where your receiver can read it: it is not shown again. ",
      "It verifies the webhook-signature header of each delivery."),
    h("div", { class: "secret-row" }, value, copy),
    copied));
  copy.focus();
}

export function render(main, ctx, args) {
  if (args.length > 0) return endpointPage(main, ctx, args[0]);
  return endpointList(main, ctx);
}

function endpointList(main) {
  const body = h("tbody", { id: "webhooks-body" });
  const messages = h("div", { "aria-live": "polite" });
  const secretSlot = h("div", { id: "secret-slot" });
  const name = h("input", { id: "w-name", name: "name", required: true, autocomplete: "off",
    maxlength: "128", placeholder: "e.g. billing" });
  const url = h("input", { id: "w-url", name: "url", type: "url", required: true, autocomplete: "off",
    spellcheck: "false", placeholder: "https://example.com/webhooks/lmsp" });
  const events = eventBoxes("w", DEFAULT_TYPES);
  const form = h("form", { class: "card", id: "webhook-form" },
    h("h2", {}, "Register an endpoint"),
    h("p", { class: "muted" }, "The service posts each subscribed event to the URL (signed as Standard Webhooks) and retries until it answers 2xx."),
    h("label", { for: "w-name" }, "Name"), name,
    h("label", { for: "w-url" }, "URL"), url,
    events.fieldset,
    h("button", { type: "submit" }, "Register"));
  main.append(h("h1", {}, "Webhooks"), messages, secretSlot,
    h("div", { class: "scroll" }, h("table", { id: "webhooks-table" },
      h("caption", { class: "sr-only" }, "Webhook endpoints, newest first"),
      h("thead", {}, h("tr", {}, ["Name", "URL", "Event types", "Secret", "Updated"]
        .map((c) => h("th", { scope: "col" }, c)))),
      body)),
    form);
  if (flash) { replace(messages, note("ok", flash)); flash = null; }

  let stopped = false;
  async function load() {
    try {
      const list = await listAll("/v1/webhook_endpoints?limit=100");
      if (stopped) return;
      replace(body, list.length === 0
        ? h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No endpoints."))
        : list.map((e) => h("tr", { "data-endpoint": e.id },
          h("td", {}, h("a", { href: webhookHref(e.id) }, e.name)),
          h("td", {}, h("code", { class: "url" }, e.url)),
          h("td", {}, e.event_types.join(", ")),
          h("td", {}, h("code", {}, e.signing_secret_hint)),
          h("td", {}, time(e.updated_at)))));
    } catch (error) {
      if (!stopped) replace(messages, note("error", `Could not list webhook endpoints: ${error.message}`));
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const types = events.values();
    if (types.length === 0) {
      replace(messages, note("error", "Tick at least one event type."));
      return;
    }
    try {
      const created = await api("/v1/webhook_endpoints", { method: "POST",
        body: { name: name.value.trim(), url: url.value.trim(), event_types: types } });
      replace(messages, note("ok", `Registered ${created.name} (${created.id}).`));
      secretBox(secretSlot, created.signing_secret, `Signing secret of ${created.name}`);
      form.reset();
      events.set(DEFAULT_TYPES);
    } catch (error) {
      replace(messages, note("error", `Not registered: ${error.message}`));
    }
    load();
  });
  load();
  return () => { stopped = true; };
}

function endpointPage(main, ctx, endpointId) {
  const controller = new AbortController();
  const signal = controller.signal;
  const path = `/v1/webhook_endpoints/${encodeURIComponent(endpointId)}`;
  const title = h("span", { id: "endpoint-name" });
  const messages = h("div", { "aria-live": "polite" });
  const head = h("dl", { class: "kv", id: "endpoint-head" });
  const secretSlot = h("div", { id: "secret-slot" });

  const testType = h("select", { id: "t-type", name: "event_type" },
    EVENT_TYPES.map((type) => h("option", { value: type }, type)));
  const sendTest = h("button", { type: "button", id: "send-test" }, "Send test");
  const testResult = h("div", { id: "test-result", "aria-live": "polite" });
  const keepOld = h("input", { type: "checkbox", id: "keep-old", name: "keep_old" });
  const rotate = h("button", { type: "button", id: "rotate-secret" }, "Rotate secret");
  const remove = h("button", { type: "button", id: "delete-endpoint", class: "danger" }, "Delete endpoint");

  const name = h("input", { id: "e-name", name: "name", required: true, autocomplete: "off", maxlength: "128" });
  const url = h("input", { id: "e-url", name: "url", type: "url", required: true, autocomplete: "off",
    spellcheck: "false" });
  const events = eventBoxes("e", []);
  const edit = h("form", { class: "card", id: "edit-form" },
    h("h2", {}, "Edit"),
    h("label", { for: "e-name" }, "Name"), name,
    h("label", { for: "e-url" }, "URL"), url,
    events.fieldset,
    h("button", { type: "submit" }, "Save"));

  const deliveries = h("tbody", { id: "deliveries-body" });
  const live = h("span", { class: "muted", id: "deliveries-updated", "aria-live": "off" });
  const refresh = h("button", { type: "button", id: "deliveries-refresh" }, "Refresh");

  main.append(
    h("p", {}, h("a", { href: "/console/webhooks" }, "← All webhook endpoints")),
    h("div", { class: "titlebar" },
      h("h1", {}, "Webhook ", title), h("code", { id: "endpoint-id" }, endpointId)),
    messages, secretSlot,
    h("div", { class: "grid" },
      h("section", { class: "card", "aria-labelledby": "endpoint-details-h" },
        h("h2", { id: "endpoint-details-h" }, "Details"), head),
      h("section", { class: "card", "aria-labelledby": "endpoint-actions-h" },
        h("h2", { id: "endpoint-actions-h" }, "Send a test event"),
        h("p", { class: "muted" }, "One sample event, now (not stored, not retried)."),
        h("div", { class: "row" }, h("label", { for: "t-type", class: "sr-only" }, "Event type"), testType, sendTest),
        testResult,
        h("h2", { class: "spaced" }, "Signing secret"),
        h("p", {}, h("label", { class: "check", for: "keep-old" }, keepOld,
          " keep the old secret signing too for 24 hours")),
        h("div", { class: "actions" }, rotate, remove))),
    h("section", { class: "deliveries", "aria-labelledby": "deliveries-h" },
      h("div", { class: "titlebar" }, h("h2", { id: "deliveries-h" }, "Deliveries"), refresh, live),
      h("div", { class: "scroll" }, h("table", { id: "deliveries-table" },
        h("caption", { class: "sr-only" }, "Deliveries, the most recent event first"),
        h("thead", {}, h("tr", {},
          ["Event", "Type", "Subject", "Status", "Attempts", "Last answer", "Next attempt", "Delivered"]
            .map((c) => h("th", { scope: "col" }, c)))),
        deliveries))),
    edit);

  let endpoint = null;

  function showEndpoint(e, { form = false } = {}) {
    endpoint = e;
    title.textContent = e.name;
    document.title = `LMSP · webhook ${e.name}`;
    replace(head,
      h("dt", {}, "URL"), h("dd", { id: "endpoint-url" }, h("code", {}, e.url)),
      h("dt", {}, "event types"), h("dd", { id: "endpoint-events" }, e.event_types.join(", ")),
      h("dt", {}, "secret"), h("dd", { id: "endpoint-hint" }, h("code", {}, e.signing_secret_hint)),
      h("dt", {}, "created"), h("dd", {}, time(e.created_at)),
      h("dt", {}, "updated"), h("dd", { id: "endpoint-updated" }, time(e.updated_at)));
    if (form) {
      name.value = e.name;
      url.value = e.url;
      events.set(e.event_types);
    }
  }

  async function loadEndpoint() {
    try {
      showEndpoint(await api(path, { signal }), { form: true });
      return true;
    } catch (error) {
      if (signal.aborted) return false;
      replace(messages, note("error", error.status === 404
        ? "No such webhook endpoint." : `Could not read the endpoint: ${error.message}`));
      return false;
    }
  }

  function deliveryRow(d) {
    const href = subjectHref(d.subject_id);
    const subject = h("code", {}, d.subject_id);
    let last = "—";
    if (d.last_status_code !== null && d.last_status_code !== undefined) last = `HTTP ${d.last_status_code}`;
    else if (d.last_error) last = d.last_error;
    return h("tr", { "data-event": d.event_id, "data-status": d.status, "data-subject": d.subject_id },
      h("td", {}, h("code", { class: "event-id" }, d.event_id)),
      h("td", {}, d.type),
      h("td", {}, href ? h("a", { href, class: "subject" }, subject) : subject),
      h("td", {}, badge(d.status)),
      h("td", { class: "num" }, String(d.attempts)),
      h("td", { class: "last" }, last),
      h("td", { class: "when" }, d.status === "pending" ? time(d.next_attempt_at) : "—"),
      h("td", { class: "when" }, time(d.delivered_at)));
  }

  let timer = null;
  async function loadDeliveries() {
    clearTimeout(timer);
    let busy = false;
    try {
      const list = await api(`${path}/deliveries?limit=${DELIVERIES}`, { signal });
      busy = list.data.some((d) => d.status === "pending");
      replace(deliveries, list.data.length === 0
        ? h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No deliveries yet."))
        : list.data.map(deliveryRow));
      live.textContent = `updated ${new Date().toLocaleTimeString(undefined, { hour12: false })}`;
    } catch (error) {
      if (signal.aborted) return;
      if (error.status === 404) return;
      busy = true;
      live.textContent = `could not read the deliveries: ${error.message}`;
    }
    if (!signal.aborted) timer = setTimeout(loadDeliveries, busy ? EVERY_MS : IDLE_MS);
  }

  sendTest.addEventListener("click", async () => {
    sendTest.disabled = true;
    replace(testResult, note("info", "Sending…"));
    try {
      const result = await api(`${path}/test`, { method: "POST", body: { event_type: testType.value } });
      const code = result.status_code;
      testResult.dataset.statusCode = String(code);
      const ok = code >= 200 && code < 300;
      replace(testResult, note(ok ? "ok" : "error", code === 0
        ? `${result.event_type}: no answer (refused, unreachable or timed out).`
        : `${result.event_type}: the receiver answered ${code}.`));
    } catch (error) {
      delete testResult.dataset.statusCode;
      replace(testResult, note("error", `Not sent: ${error.message}`));
    } finally {
      sendTest.disabled = false;
    }
  });

  rotate.addEventListener("click", async () => {
    const keep = keepOld.checked;
    const yes = await confirmDialog(keep
      ? `Rotate the signing secret of ${endpoint?.name ?? endpointId}? Deliveries are signed with the new and the old secret for 24 hours.`
      : `Rotate the signing secret of ${endpoint?.name ?? endpointId}? The old secret stops signing at once.`,
    "Rotate secret");
    if (!yes) { rotate.focus(); return; }
    rotate.disabled = true;
    try {
      const rotated = await api(`${path}/rotate_secret`, { method: "POST",
        body: keep ? { keep_old_secret_active_for_24_hours: true } : {} });
      showEndpoint(rotated);
      replace(messages, note("ok", keep
        ? "Secret rotated; the old one keeps signing for 24 hours." : "Secret rotated."));
      secretBox(secretSlot, rotated.signing_secret, `New signing secret of ${rotated.name}`);
      keepOld.checked = false;
    } catch (error) {
      replace(messages, note("error", `Not rotated: ${error.message}`));
    } finally {
      rotate.disabled = false;
    }
  });

  remove.addEventListener("click", async () => {
    const label = endpoint ? `${endpoint.name} (${endpointId})` : endpointId;
    const yes = await confirmDialog(
      `Delete the webhook endpoint ${label}? No more events are sent to it; its pending deliveries are dropped.`,
      "Delete");
    if (!yes) { remove.focus(); return; }
    try {
      await api(path, { method: "DELETE" });
      flash = `Deleted ${label}.`;
      ctx.go("/console/webhooks");
    } catch (error) {
      replace(messages, note("error", `Not deleted: ${error.message}`));
    }
  });

  edit.addEventListener("submit", async (event) => {
    event.preventDefault();
    const types = events.values();
    if (types.length === 0) {
      replace(messages, note("error", "Tick at least one event type."));
      return;
    }
    try {
      const updated = await api(path, { method: "POST",
        body: { name: name.value.trim(), url: url.value.trim(), event_types: types } });
      showEndpoint(updated, { form: true });
      replace(messages, note("ok", "Saved."));
      // A test's answer was about the endpoint as it was.
      delete testResult.dataset.statusCode;
      testResult.replaceChildren();
    } catch (error) {
      replace(messages, note("error", `Not saved: ${error.message}`));
    }
  });

  refresh.addEventListener("click", () => loadDeliveries());

  loadEndpoint().then((found) => { if (found) loadDeliveries(); });
  return () => { controller.abort(); clearTimeout(timer); };
}
