// The web console in a real browser: Debian's /usr/bin/chromium driven by playwright-core
// against a running `lmsp serve` (started by tests/console_browser.rs).
//
// Env: LMSP_BASE_URL (http://127.0.0.1:PORT), LMSP_ADMIN_TOKEN, optional LMSP_SCREENSHOTS (a
// directory: one PNG per view). Exits 0 when every step passed; prints each step. Any console
// error, page error, unexpected dialog or CSP violation anywhere in the run fails it (failed
// loads only while the test cuts the network on purpose).
import { chromium } from "playwright-core";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statfsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import net from "node:net";
import http from "node:http";

const target = process.env.LMSP_BASE_URL;
const admin = process.env.LMSP_ADMIN_TOKEN;
const shots = process.env.LMSP_SCREENSHOTS;
if (!target || !admin) throw new Error("LMSP_BASE_URL and LMSP_ADMIN_TOKEN are required");

// The browser reaches the service through this TCP proxy, so that the test can cut every
// connection at once (a real network drop: `context.setOffline` leaves open streams alone).
const upstream = new URL(target);
const sockets = new Set();
const proxy = net.createServer((client) => {
  const server = net.connect(Number(upstream.port), upstream.hostname);
  for (const socket of [client, server]) {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
  }
  client.pipe(server);
  server.pipe(client);
});
await new Promise((resolve) => { proxy.listen(0, "127.0.0.1", resolve); });
const base = `http://127.0.0.1:${proxy.address().port}`;
const dropConnections = () => { for (const socket of sockets) socket.destroy(); };
const this_client = { id: null };

// A webhook receiver: answers 200 to every POST and keeps what it was sent.
const received = [];
const receiver = http.createServer((request, reply) => {
  let body = "";
  request.setEncoding("utf8");
  request.on("data", (chunk) => { body += chunk; });
  request.on("end", () => {
    let json = null;
    try { json = JSON.parse(body); } catch { json = null; }
    received.push({ method: request.method, path: request.url, headers: request.headers, json });
    reply.writeHead(200, { "Content-Type": "text/plain" });
    reply.end("ok");
  });
});
await new Promise((resolve) => { receiver.listen(0, "127.0.0.1", resolve); });
const hookUrl = `http://127.0.0.1:${receiver.address().port}/hook`;
// A port nobody listens on (bound, then let go): a receiver that does not answer.
const closedPort = await new Promise((resolve) => {
  const probe = net.createServer();
  probe.listen(0, "127.0.0.1", () => { const { port } = probe.address(); probe.close(() => resolve(port)); });
});
const deadUrl = `http://127.0.0.1:${closedPort}/hook`;
const XSS = "<img src=x onerror=alert(1)>";

async function call(method, path, body, token = admin) {
  const response = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  let json = null;
  try { json = JSON.parse(text); } catch { json = null; }
  return { status: response.status, json };
}

/** Uploads `text` as a batch input file (multipart, as a client would) and creates a batch. */
async function createBatch(lines, token = admin) {
  const form = new FormData();
  form.append("purpose", "batch");
  const text = lines.map((line) => (typeof line === "string" ? line : JSON.stringify(line))).join("\n");
  form.append("file", new Blob([`${text}\n`], { type: "application/jsonl" }), "lines.jsonl");
  const uploaded = await fetch(`${base}/v1/files`, {
    method: "POST", headers: { Authorization: `Bearer ${token}` }, body: form,
  });
  assert.equal(uploaded.status, 200, await uploaded.clone().text());
  const file = await uploaded.json();
  const batch = await call("POST", "/v1/batches", {
    input_file_id: file.id, endpoint: "/v1/responses", completion_window: "24h",
  }, token);
  assert.equal(batch.status, 200, JSON.stringify(batch.json));
  return batch.json;
}

/** A batch line of the reference model. */
const batchLine = (customId, input, maxTokens = 4) => ({
  custom_id: customId, method: "POST", url: "/v1/responses",
  body: { model: "reference", input, max_output_tokens: maxTokens },
});

/** The bytes of a stored file, as text. */
async function fileText(id) {
  const response = await fetch(`${base}/v1/files/${id}/content`, { headers: { Authorization: `Bearer ${admin}` } });
  assert.equal(response.status, 200);
  return response.text();
}

// Chromium's flags: the four the console's CI contract names, then only what a test browser
// needs besides (no QUIC, no first-run, component-update or sync traffic), and
// --disable-dev-shm-usage only where /dev/shm is too small for Chromium's shared memory.
// The profile is a fresh --user-data-dir of this run (Playwright passes it, from the
// persistent context's directory), removed at the end.
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync"];
const shmBytes = (() => {
  try { const fs = statfsSync("/dev/shm"); return fs.blocks * fs.bsize; } catch { return 0; }
})();
if (shmBytes < 512 * 1024 * 1024) FLAGS.push("--disable-dev-shm-usage");
const profile = mkdtempSync(join(tmpdir(), "lmsp-console-chromium-"));
console.log(`# chromium ${FLAGS.join(" ")} --user-data-dir=${profile}`);
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: FLAGS,
  viewport: { width: 1200, height: 860 },
});
const problems = [];
// Only while the test cuts every connection on purpose are failed loads (net::ERR_…) expected.
let networkDrop = false;
let failed = false;
try {
  const page = context.pages()[0] ?? await context.newPage();
  page.setDefaultTimeout(20000);
  page.on("console", (msg) => {
    if (msg.type() !== "error") return;
    if (networkDrop && /net::ERR_/.test(msg.text())) return;
    problems.push(`console error: ${msg.text()} at ${msg.location().url}`);
  });
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  page.on("dialog", async (dialog) => {
    problems.push(`unexpected dialog: ${dialog.message()}`);
    await dialog.dismiss();
  });
  await page.exposeFunction("__cspViolation", (text) => problems.push(`CSP violation: ${text}`));
  await page.addInitScript(() => {
    document.addEventListener("securitypolicyviolation", (e) => {
      window.__cspViolation(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
    });
  });

  const step = async (name, fn) => {
    const started = Date.now();
    await fn();
    console.log(`ok - ${name} (${Date.now() - started} ms)`);
  };
  const shot = async (name) => {
    if (!shots) return;
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: join(shots, `${name}.png`) });
  };
  const nav = (name) => page.locator("#nav").getByRole("link", { name, exact: true }).click();
  /** Presses Tab (Shift+Tab with `back`) until the focused element matches `selector`. */
  const tabTo = async (selector, { back = false, max = 80 } = {}) => {
    for (let i = 0; i <= max; i += 1) {
      if (await page.evaluate((sel) => document.activeElement?.matches(sel) ?? false, selector)) return;
      await page.keyboard.press(back ? "Shift+Tab" : "Tab");
    }
    assert.fail(`${back ? "Shift+Tab" : "Tab"} never reached ${selector}`);
  };
  /** The focused element shows a focus ring: it matches :focus-visible and has an outline. */
  const assertFocusVisible = async (what) => {
    const ring = await page.evaluate(() => {
      const el = document.activeElement;
      const style = getComputedStyle(el);
      return { visible: el.matches(":focus-visible"), style: style.outlineStyle,
        width: parseFloat(style.outlineWidth) || 0 };
    });
    assert.ok(ring.visible && ring.style !== "none" && ring.width > 0,
      `no visible focus on ${what}: ${JSON.stringify(ring)}`);
  };
  const focusedValue = () => page.evaluate(() => document.activeElement?.value);

  await step("the console's headers are strict", async () => {
    const response = await page.goto(`${base}/console/`);
    const headers = response.headers();
    assert.match(headers["content-security-policy"], /default-src 'self'/);
    assert.match(headers["content-security-policy"], /require-trusted-types-for 'script'/);
    assert.equal(headers["x-content-type-options"], "nosniff");
    assert.equal(headers["referrer-policy"], "no-referrer");
    const trick = await fetch(`${base}/console/%2e%2e/%2e%2e/Cargo.toml`);
    assert.equal(trick.status, 404);
  });

  await step("not logged in: the login form; the token is kept in sessionStorage only", async () => {
    await page.waitForURL(/\/console\/login$/);
    await shot("login");
    await page.fill("#token", admin);
    await page.click("#login button[type=submit]");
    await page.waitForURL(/\/console\/$/);
    const stored = await page.evaluate(() => ({
      session: Object.values(sessionStorage), local: Object.keys(localStorage).length,
      cookie: document.cookie,
    }));
    assert.deepEqual(stored.session, [admin]);
    assert.equal(stored.local, 0);
    assert.equal(stored.cookie, "");
    assert.ok(!page.url().includes(admin));
  });

  const service = (await call("GET", "/v1/service")).json;
  await step("overview shows the service id, version, store and engine health and live counts", async () => {
    await page.locator("#service-id").getByText(service.id).waitFor();
    assert.equal(await page.textContent("#service-version"), service.version);
    await page.locator('#counts [data-status="queued"]').waitFor();
    await page.locator("#health .st-ok").waitFor();
    assert.deepEqual(service.engine, { kind: "reference", status: "ok", detail: null });
    assert.deepEqual(service.caller.scopes, ["admin"]);
    const engine = page.locator('#engine-health[data-kind="reference"][data-status="ok"]');
    await engine.locator(".st-ok").waitFor();
    assert.match(await engine.textContent(), /^reference ok$/);
    await page.locator("svg.chart").first().waitFor();
    // Every nav entry shows for an admin.
    for (const name of ["Tasks", "Batches", "Submit", "Models", "Clients", "Webhooks"]) {
      assert.ok(await page.locator("#nav").getByRole("link", { name, exact: true }).isVisible(), name);
    }
    await shot("overview");
  });

  await step("submit from the form: the streamed text equals the stored output_text; the prompt is text", async () => {
    await nav("Submit");
    await page.locator("#s-model option[value=reference]").waitFor({ state: "attached" });
    await page.fill("#s-input", `Once upon a time ${XSS}`);
    await page.fill("#s-tokens", "40");
    await page.selectOption("#s-restart", "resume");
    await page.click("#submit-form button[type=submit]");
    await page.locator('#task-status[data-status="completed"]').waitFor();
    await page.locator('#timeline li[data-type="response.completed"]').waitFor();
    const taskId = await page.textContent("#task-id");
    const task = (await call("GET", `/v1/tasks/${taskId}`)).json;
    const response = (await call("GET", `/v1/responses/${task.response_id}`)).json;
    assert.ok(response.output_text.length > 0);
    assert.equal(await page.textContent("#output"), response.output_text);
    assert.equal(await page.textContent("#submitted-prompt"), `Once upon a time ${XSS}`);
    assert.equal(await page.locator("img").count(), 0, "the prompt was parsed as HTML");
    await shot("submit");
  });

  await step("a task started through the API updates live, with its timeline", async () => {
    // 400 tokens at the server's 20 ms each: it runs for seconds while the page watches it.
    const created = await call("POST", "/v1/responses", {
      model: "reference", input: "The forest", background: true, max_output_tokens: 400,
      metadata: { note: XSS },
    });
    assert.equal(created.status, 202);
    const taskId = created.json.task_id;
    await nav("Tasks");
    await page.locator(`#tasks-body tr[data-task="${taskId}"]`).waitFor();
    // Newest first: the row of this task is the first.
    assert.equal(await page.locator("#tasks-body tr").first().getAttribute("data-task"), taskId);
    await shot("tasks");
    await page.locator(`#tasks-body tr[data-task="${taskId}"] a`).click();
    await page.waitForURL(new RegExp(`/console/tasks/${taskId}$`));
    // Before the task completes: the stream is live and the output grows (two lengths seen).
    const whileLive = (seenBefore) => page.waitForFunction((before) => {
      const done = document.querySelector("#task-status")?.dataset.status === "completed";
      if (done) throw new Error("the task completed before its output was seen growing");
      const live = document.querySelector("#stream-state")?.dataset.state === "live";
      const length = document.querySelector("#output")?.textContent.length ?? 0;
      return live && length > before ? length : false;
    }, seenBefore, { polling: 50 }).then((handle) => handle.jsonValue());
    const first = await whileLive(0);
    const second = await whileLive(first);
    assert.ok(second > first && first > 0, `${first} then ${second}`);
    await page.locator('#task-status[data-status="completed"]').waitFor();
    for (const type of ["created", "loading", "in_progress", "completed"]) {
      await page.locator(`#timeline li[data-type="response.${type}"]`).waitFor();
    }
    const response = (await call("GET", `/v1/responses/${created.json.id}`)).json;
    assert.equal(await page.textContent("#output"), response.output_text);
    assert.match(await page.textContent("#task-head"), /img src=x onerror/);
    assert.equal(await page.locator("img").count(), 0);
    await page.click("#show-response");
    await page.locator("#response-json").getByText(created.json.id).first().waitFor();
    await shot("task");
  });

  await step("cancel a slow task: it ends cancelled", async () => {
    const created = await call("POST", "/v1/responses", {
      model: "reference", input: "A long story", background: true, max_output_tokens: 100000,
    });
    const taskId = created.json.task_id;
    await page.goto(`${base}/console/tasks/${taskId}`);
    await page.locator('#timeline li[data-type="response.in_progress"]').waitFor();
    await page.locator("#output").filter({ hasText: /\S/ }).waitFor();
    await page.locator("#cancel").click();
    await page.locator("#confirm-yes").click();
    await page.locator('#task-status[data-status="cancelled"]').waitFor();
    await page.locator('#timeline li[data-type="response.cancelled"]').waitFor();
    assert.equal((await call("GET", `/v1/tasks/${taskId}`)).json.status, "cancelled");
    assert.ok(await page.locator("#cancel").isHidden());
  });

  await step("the stream resumes after a network drop, by sequence number", async () => {
    const created = await call("POST", "/v1/responses", {
      model: "reference", input: "Resume me", background: true, max_output_tokens: 150,
    });
    const taskId = created.json.task_id;
    const streams = [];
    const onRequest = (request) => {
      const url = new URL(request.url());
      if (url.pathname === `/v1/tasks/${taskId}/events`) streams.push(Number(url.searchParams.get("after")));
    };
    page.on("request", onRequest);
    await page.goto(`${base}/console/tasks/${taskId}`);
    await page.locator('#stream-state[data-state="live"]').waitFor();
    await page.locator("#output").filter({ hasText: /\S/ }).waitFor();
    networkDrop = true;
    try {
      dropConnections();
      await page.locator('#task-status[data-status="completed"]').waitFor();
      await page.locator('#timeline li[data-type="response.completed"]').waitFor();
    } finally {
      networkDrop = false;
      page.off("request", onRequest);
    }
    assert.ok(streams.length >= 2, `the stream was not reopened: ${streams}`);
    assert.equal(streams[0], 0);
    assert.ok(streams[1] > 0, `the second stream did not resume by sequence number: ${streams}`);
    const response = (await call("GET", `/v1/responses/${created.json.id}`)).json;
    assert.equal(await page.textContent("#output"), response.output_text);
    const seqs = await page.locator("#timeline li").evaluateAll((items) => items.map((li) => Number(li.dataset.seq)));
    assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), "no event shown twice");
  });

  await step("models: the list shows the reference model with its digest", async () => {
    await nav("Models");
    const row = page.locator('#models-body tr[data-model="reference"]');
    await row.waitFor();
    assert.match(await row.textContent(), /sha256:/);
    await shot("models");
  });

  const batchState = { id: null };
  await step("batches: a batch made through the API is listed and completes 3/3", async () => {
    const batch = await createBatch([
      batchLine("line-1", [
        { role: "system", content: "Answer briefly." },
        { role: "user", content: [{ type: "input_text", text: `First line ${XSS}` }] },
      ]), batchLine("line-2", "Second line"), batchLine("line-3", "hi"),
    ]);
    batchState.id = batch.id;
    await nav("Batches");
    await page.waitForURL(/\/console\/batches$/);
    const row = page.locator(`#batches-body tr[data-batch="${batch.id}"]`);
    await row.waitFor();
    // Newest first; refreshed until it has finished.
    assert.equal(await page.locator("#batches-body tr").first().getAttribute("data-batch"), batch.id);
    await page.locator(`#batches-body tr[data-batch="${batch.id}"][data-status="completed"]`).waitFor();
    const progress = row.locator(".progress");
    assert.equal(await progress.getAttribute("data-done"), "3");
    assert.equal(await progress.getAttribute("data-total"), "3");
    assert.match(await row.textContent(), /3\/3/);
    assert.match(await row.textContent(), /\/v1\/responses/);
    assert.equal(await row.locator("progress").getAttribute("value"), "3");
    await shot("batches");
  });

  await step("a batch's page: its counts, and its output downloaded (keyboard) with the token", async () => {
    const id = batchState.id;
    await page.locator(`#batches-body tr[data-batch="${id}"] a`).click();
    await page.waitForURL(new RegExp(`/console/batches/${id}$`));
    await page.locator('#batch-status[data-status="completed"]').waitFor();
    assert.equal(await page.textContent("#count-total"), "3");
    assert.equal(await page.textContent("#count-completed"), "3");
    assert.equal(await page.textContent("#count-failed"), "0");
    assert.ok(await page.locator("#batch-cancel").isHidden(), "no Cancel once completed");
    const batch = (await call("GET", `/v1/batches/${id}`)).json;
    assert.ok(batch.output_file_id);
    assert.equal(await page.locator("#download-errors").isHidden(), !batch.error_file_id);
    await page.locator(`#batch-files [data-file="${batch.input_file_id}"]`).getByText("lines.jsonl").waitFor();
    await tabTo("#download-output");
    await assertFocusVisible("the Download output button");
    const [saved] = await Promise.all([page.waitForEvent("download"), page.keyboard.press("Enter")]);
    assert.equal(saved.suggestedFilename(), `${id}_output.jsonl`);
    const text = readFileSync(await saved.path(), "utf8");
    assert.equal(text, await fileText(batch.output_file_id));
    const lines = text.trim().split("\n").map((line) => JSON.parse(line));
    assert.deepEqual(lines.map((line) => line.custom_id).sort(), ["line-1", "line-2", "line-3"]);
    batchState.lines = lines;
    await shot("batch");
  });

  await step("a batch line's task page shows its batch, custom_id and input (as text)", async () => {
    const line = batchState.lines.find((l) => l.custom_id === "line-1");
    const taskId = line.response.request_id;
    const task = (await call("GET", `/v1/tasks/${taskId}`)).json;
    assert.equal(task.batch_id, batchState.id);
    assert.equal(task.custom_id, "line-1");
    await page.goto(`${base}/console/tasks/${taskId}`);
    await page.locator('#task-status[data-status="completed"]').waitFor();
    assert.equal(await page.textContent("#task-batch"), batchState.id);
    assert.equal(await page.textContent("#task-custom-id"), "line-1");
    // The input, oldest first: each message's role and text.
    const items = page.locator('#task-input li[data-type="message"]');
    await items.first().waitFor();
    const shown = await items.evaluateAll((lis) => lis.map((li) => [li.dataset.role, li.querySelector("pre").textContent]));
    assert.deepEqual(shown, [["system", "Answer briefly."], ["user", `First line ${XSS}`]]);
    assert.equal(await page.locator("img").count(), 0, "the input was parsed as HTML");
    await shot("batch-task");
    await page.click("#task-batch");
    await page.waitForURL(new RegExp(`/console/batches/${batchState.id}$`));
    await page.locator('#batch-status[data-status="completed"]').waitFor();
  });

  await step("a refused batch shows its errors by line, as text", async () => {
    const batch = await createBatch([
      batchLine("ok-1", "fine"), `not json ${XSS}`, batchLine("ok-1", "a repeated custom_id"),
    ]);
    await page.goto(`${base}/console/batches/${batch.id}`);
    await page.locator('#batch-status[data-status="failed"]').waitFor();
    const rows = page.locator("#batch-errors-table tbody tr");
    await rows.first().waitFor();
    const failed = (await call("GET", `/v1/batches/${batch.id}`)).json;
    assert.equal(await rows.count(), failed.errors.data.length);
    const shown = await rows.evaluateAll((trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
    assert.deepEqual(shown, failed.errors.data.map((e) =>
      [e.line == null ? "—" : String(e.line), e.code, e.param ?? "—", e.message]));
    assert.ok(failed.errors.data.some((e) => e.line === 2), JSON.stringify(failed.errors));
    assert.equal(await page.locator("img").count(), 0);
    assert.ok(await page.locator("#batch-cancel").isHidden());
    assert.ok(await page.locator("#download-output").isHidden());
  });

  await step("cancel a running batch (after a confirmation): it ends cancelled, its errors downloadable", async () => {
    const batch = await createBatch([
      batchLine("slow-1", "A long story", 100000), batchLine("slow-2", "Another long story", 100000),
    ]);
    await page.goto(`${base}/console/batches/${batch.id}`);
    await page.locator('#batch-status[data-status="in_progress"]').waitFor();
    await page.locator("#batch-cancel").click();
    await page.locator("#confirm-no").click();
    await page.locator("dialog.confirm").waitFor({ state: "detached" });
    assert.equal((await call("GET", `/v1/batches/${batch.id}`)).json.status, "in_progress", "Keep cancelled nothing");
    await page.locator("#batch-cancel").click();
    await page.locator("#confirm-yes").click();
    await page.locator('#batch-status[data-status="cancelled"]').waitFor();
    assert.ok(await page.locator("#batch-cancel").isHidden());
    const cancelled = (await call("GET", `/v1/batches/${batch.id}`)).json;
    assert.equal(cancelled.status, "cancelled");
    assert.ok(cancelled.error_file_id, "the cancelled lines are in the error file");
    await page.locator("#download-errors").waitFor();
    const [saved] = await Promise.all([page.waitForEvent("download"), page.click("#download-errors")]);
    assert.equal(saved.suggestedFilename(), `${batch.id}_errors.jsonl`);
    assert.equal(readFileSync(await saved.path(), "utf8"), await fileText(cancelled.error_file_id));
  });

  const hook = { id: null, secret: null };
  await step("webhooks: register an endpoint; its signing secret is shown once, with a copy button", async () => {
    await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: base });
    await nav("Webhooks");
    await page.waitForURL(/\/console\/webhooks$/);
    await page.locator("#webhooks-body tr").first().waitFor();
    await page.fill("#w-name", `Receiver ${XSS}`);
    await page.fill("#w-url", hookUrl);
    // response.completed and batch.completed are ticked already; add response.failed.
    assert.ok(await page.locator("#w-response-completed").isChecked());
    await page.check("#w-response-failed");
    await page.click("#webhook-form button[type=submit]");
    const box = page.locator("#secret-box");
    await box.waitFor();
    hook.secret = await page.textContent("#webhook-secret");
    assert.match(hook.secret, /^whsec_\S+$/);
    assert.match(await page.textContent("#secret-warning"), /not shown again/);
    assert.equal(await page.evaluate(() => document.activeElement?.id), "copy-secret");
    await page.click("#copy-secret");
    await page.locator("#copy-status").getByText("Copied to the clipboard.").waitFor();
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), hook.secret);
    const list = (await call("GET", "/v1/webhook_endpoints")).json;
    const endpoint = list.data.find((e) => e.name === `Receiver ${XSS}`);
    assert.ok(endpoint, JSON.stringify(list));
    hook.id = endpoint.id;
    assert.equal(endpoint.url, hookUrl);
    assert.deepEqual(endpoint.event_types, ["response.completed", "response.failed", "batch.completed"]);
    assert.ok(hook.secret.endsWith(endpoint.signing_secret_hint.slice(-4)), endpoint.signing_secret_hint);
    assert.equal(endpoint.signing_secret, undefined, "the list shows no secret");
    const row = page.locator(`#webhooks-body tr[data-endpoint="${hook.id}"]`);
    await row.waitFor();
    const cells = await row.locator("td").evaluateAll((tds) => tds.map((td) => td.textContent));
    assert.deepEqual(cells.slice(0, 4), [`Receiver ${XSS}`, hookUrl,
      "response.completed, response.failed, batch.completed", endpoint.signing_secret_hint]);
    assert.equal(await page.locator("img").count(), 0, "the name was parsed as HTML");
    await shot("webhooks");
    // Shown once: gone after a reload, and nowhere in the page.
    await page.reload();
    await row.waitFor();
    assert.equal(await page.locator("#webhook-secret").count(), 0);
    assert.ok(!(await page.textContent("body")).includes(hook.secret));
  });

  await step("webhooks: an endpoint's page sends a test event and shows the receiver's 200", async () => {
    await page.locator(`#webhooks-body tr[data-endpoint="${hook.id}"] a`).click();
    await page.waitForURL(new RegExp(`/console/webhooks/${hook.id}$`));
    await page.locator("#endpoint-url").getByText(hookUrl).waitFor();
    assert.equal(await page.textContent("#endpoint-name"), `Receiver ${XSS}`);
    assert.equal(await page.inputValue("#e-url"), hookUrl);
    assert.ok(await page.locator("#e-response-failed").isChecked());
    assert.ok(!(await page.locator("#e-batch-failed").isChecked()));
    await page.locator("#deliveries-body").getByText("No deliveries yet.").waitFor();
    const before = received.length;
    await page.selectOption("#t-type", "batch.failed");
    await page.click("#send-test");
    await page.locator('#test-result[data-status-code="200"]').waitFor();
    assert.match(await page.textContent("#test-result"), /batch\.failed: the receiver answered 200/);
    assert.equal(received.length, before + 1);
    const sample = received[received.length - 1];
    assert.equal(sample.method, "POST");
    assert.equal(sample.json.type, "batch.failed");
    assert.match(sample.headers["webhook-id"], /^evt_/);
    assert.match(sample.headers["webhook-signature"], /^v1,/);
  });

  await step("webhooks: edit the endpoint (a URL nobody answers): a test shows \"no answer\"", async () => {
    await page.fill("#e-name", "Receiver (edited)");
    await page.fill("#e-url", deadUrl);
    await page.click("#edit-form button[type=submit]");
    await page.locator("#endpoint-url").getByText(deadUrl).waitFor();
    assert.equal(await page.textContent("#endpoint-name"), "Receiver (edited)");
    const endpoint = (await call("GET", `/v1/webhook_endpoints/${hook.id}`)).json;
    assert.equal(endpoint.name, "Receiver (edited)");
    assert.equal(endpoint.url, deadUrl);
    assert.deepEqual(endpoint.event_types, ["response.completed", "response.failed", "batch.completed"]);
    await page.selectOption("#t-type", "response.completed");
    await page.click("#send-test");
    await page.locator('#test-result[data-status-code="0"]').waitFor();
    assert.match(await page.textContent("#test-result"), /no answer/);
  });

  await step("webhooks: a background response's delivery is pending, then delivered, linked to its task", async () => {
    const created = await call("POST", "/v1/responses", {
      model: "reference", input: "Tell the receiver", background: true, max_output_tokens: 4,
    });
    assert.equal(created.status, 202);
    const responseId = created.json.id;
    for (let tries = 0; (await call("GET", `/v1/tasks/${created.json.task_id}`)).json.status !== "completed"; tries += 1) {
      assert.ok(tries < 400, "the response never completed");
      await new Promise((resolve) => { setTimeout(resolve, 50); });
    }
    // Nobody answers yet: pending, with the error of its last attempt and its next attempt.
    await page.click("#deliveries-refresh");
    const selector = `#deliveries-body tr[data-subject="${responseId}"]`;
    const row = page.locator(selector);
    await page.locator(`${selector}[data-status="pending"]`).waitFor();
    // Refreshed while pending: its first failed attempt shows.
    await page.waitForFunction((sel) => {
      const last = document.querySelector(`${sel} td.last`)?.textContent;
      return last && last !== "—";
    }, selector);
    assert.match(await row.textContent(), /response\.completed/);
    assert.notEqual(await row.locator("td").nth(6).textContent(), "—", "the next attempt is shown");
    await shot("webhook-pending");
    // The receiver is back: the retry delivers it and the table, refreshing, shows it.
    await page.fill("#e-url", hookUrl);
    await page.click("#edit-form button[type=submit]");
    await page.locator("#endpoint-url").getByText(hookUrl).waitFor();
    await page.locator(`${selector}[data-status="delivered"]`).waitFor({ timeout: 30000 });
    const eventId = await row.getAttribute("data-event");
    const cells = await row.locator("td").evaluateAll((tds) => tds.map((td) => td.textContent));
    assert.equal(cells[0], eventId);
    assert.equal(cells[1], "response.completed");
    assert.equal(cells[2], responseId);
    assert.equal(cells[3], "delivered");
    assert.ok(Number(cells[4]) >= 2, `attempts: ${cells[4]}`);
    assert.equal(cells[5], "HTTP 200");
    assert.equal(cells[6], "—");
    assert.notEqual(cells[7], "—");
    const delivered = received.filter((r) => r.headers["webhook-id"] === eventId);
    assert.equal(delivered.length, 1, "the receiver got the event once");
    assert.equal(delivered[0].json.type, "response.completed");
    assert.equal(delivered[0].json.data.id, responseId);
    const api = (await call("GET", `/v1/webhook_endpoints/${hook.id}/deliveries`)).json;
    assert.equal(api.data.find((d) => d.event_id === eventId).status, "delivered");
    await shot("webhook");
    // The subject links to the response's task.
    const link = row.locator("a.subject");
    assert.equal(await link.getAttribute("href"), `/console/tasks/${created.json.task_id}`);
    await link.click();
    await page.waitForURL(new RegExp(`/console/tasks/${created.json.task_id}$`));
    await page.locator('#task-status[data-status="completed"]').waitFor();
    await page.goBack();
    await page.waitForURL(new RegExp(`/console/webhooks/${hook.id}$`));
  });

  await step("webhooks: rotate the secret (keeping the old one a day): the new one is shown once", async () => {
    await page.locator("#endpoint-url").getByText(hookUrl).waitFor();
    await page.check("#keep-old");
    await page.click("#rotate-secret");
    await page.locator("#confirm-yes").click();
    await page.locator("#secret-box").waitFor();
    const secret = await page.textContent("#webhook-secret");
    assert.match(secret, /^whsec_\S+$/);
    assert.notEqual(secret, hook.secret);
    assert.match(await page.textContent("#secret-warning"), /not shown again/);
    const endpoint = (await call("GET", `/v1/webhook_endpoints/${hook.id}`)).json;
    assert.equal(await page.textContent("#endpoint-hint"), endpoint.signing_secret_hint);
    assert.ok(secret.endsWith(endpoint.signing_secret_hint.slice(-4)));
    // Both secrets sign a test delivery for now: two v1 signatures.
    const before = received.length;
    await page.click("#send-test");
    await page.locator("#test-result").getByText(/answered 200/).waitFor();
    assert.equal(received.length, before + 1);
    assert.equal(received[received.length - 1].headers["webhook-signature"].split(" ").length, 2);
  });

  await step("webhooks: delete the endpoint (after a confirmation)", async () => {
    await page.click("#delete-endpoint");
    await page.locator("#confirm-no").click();
    await page.locator("dialog.confirm").waitFor({ state: "detached" });
    assert.equal((await call("GET", `/v1/webhook_endpoints/${hook.id}`)).status, 200, "Keep deleted nothing");
    await page.click("#delete-endpoint");
    await page.locator("#confirm-yes").click();
    await page.waitForURL(/\/console\/webhooks$/);
    await page.locator("#main .note.ok").getByText(/^Deleted Receiver \(edited\)/).waitFor();
    await page.locator("#webhooks-body tr").first().waitFor();
    assert.equal(await page.locator(`#webhooks-body tr[data-endpoint="${hook.id}"]`).count(), 0);
    assert.equal((await call("GET", `/v1/webhook_endpoints/${hook.id}`)).status, 404);
  });

  await step("clients: create a pairing code, shown with its countdown", async () => {
    await nav("Clients");
    await page.locator("#clients-body tr").first().waitFor();
    await page.click("#pairing-form button[type=submit]");
    const code = await page.locator("#pairing-code").textContent();
    assert.match(code, /^\d{3}-\d{3}$/);
    await page.locator("#pairing-countdown").getByText(/expires in (9|10):\d\d/).waitFor();
    // A client pairs with it, under a name that looks like HTML.
    const pairBody = { code, name: XSS, scopes: ["responses:read"] };
    const paired = await fetch(`${base}/v1/pair`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(pairBody),
    });
    assert.equal(paired.status, 201);
    this_client.id = (await paired.json()).client_id;
    await shot("clients");
  });

  await step("clients: revoke with confirmation; the name renders as text", async () => {
    await page.reload();
    const row = page.locator(`#clients-body tr[data-client="${this_client.id}"]`);
    await row.waitFor();
    assert.match(await row.textContent(), /<img src=x onerror=alert\(1\)>/);
    assert.equal(await page.locator("img").count(), 0);
    await row.locator("button.revoke").click();
    await page.locator("#confirm-no").click();
    assert.equal(await row.locator("button.revoke").count(), 1, "keep did not revoke");
    await row.locator("button.revoke").click();
    await page.locator("#confirm-yes").click();
    await row.locator("button.revoke").waitFor({ state: "detached" });
    const list = (await call("GET", "/v1/clients")).json;
    assert.ok(list.data.find((c) => c.id === this_client.id).revoked_at);
  });

  await step("keyboard only: the nav, with a visible focus ring", async () => {
    await page.goto(`${base}/console/`);
    await page.locator("#service-id").waitFor();
    await tabTo('#nav a[data-view="submit"]');
    await assertFocusVisible("the Submit link");
    await page.keyboard.press("Enter");
    await page.waitForURL(/\/console\/submit$/);
  });

  await step("keyboard only: fill the submit form and submit it", async () => {
    await page.locator("#s-model option[value=reference]").waitFor({ state: "attached" });
    await tabTo("#s-model");
    await assertFocusVisible("the model picker");
    assert.equal(await focusedValue(), "reference");
    await tabTo("#s-input");
    await page.keyboard.type("Typed at the keyboard");
    await tabTo("#s-restart");
    await page.keyboard.type("resume");
    assert.equal(await focusedValue(), "resume");
    await tabTo("#s-tokens");
    await page.keyboard.press("Control+A");
    await page.keyboard.type("30");
    await tabTo("#submit-form button[type=submit]");
    await assertFocusVisible("the Submit button");
    await page.keyboard.press("Enter");
    await page.locator('#task-status[data-status="completed"]').waitFor();
    const task = (await call("GET", `/v1/tasks/${await page.textContent("#task-id")}`)).json;
    const response = (await call("GET", `/v1/responses/${task.response_id}`)).json;
    assert.equal(task.on_restart, "resume");
    assert.equal(response.max_output_tokens, 30);
    assert.equal(await page.textContent("#submitted-prompt"), "Typed at the keyboard");
    assert.equal(await page.textContent("#output"), response.output_text);
  });

  await step("keyboard only: the tasks filters (Space) and paging (Enter, Shift+Tab)", async () => {
    // More completed tasks than one page holds.
    const ids = [];
    for (let i = 0; i < 22; i += 1) {
      const created = await call("POST", "/v1/responses", {
        model: "reference", input: `Page filler ${i}`, background: true, max_output_tokens: 1,
      });
      ids.push(created.json.task_id);
    }
    for (const id of ids) {
      for (let tries = 0; (await call("GET", `/v1/tasks/${id}`)).json.status !== "completed"; tries += 1) {
        assert.ok(tries < 400, `${id} never completed`);
        await new Promise((resolve) => { setTimeout(resolve, 50); });
      }
    }
    await tabTo('#nav a[data-view="tasks"]', { back: true });
    await page.keyboard.press("Enter");
    await page.waitForURL(/\/console\/tasks$/);
    await page.locator("#tasks-body tr[data-task]").first().waitFor();
    await tabTo("#f-status");
    await assertFocusVisible("the status filter");
    await page.keyboard.type("completed");
    assert.equal(await focusedValue(), "completed");
    await tabTo("form.filters button[type=submit]");
    await assertFocusVisible("the Filter button");
    await page.keyboard.press("Space");
    await page.waitForURL(/\/console\/tasks\?status=completed$/);
    const rows = page.locator("#tasks-body tr[data-task]");
    const statuses = () => rows.evaluateAll((trs) => trs.map((tr) => tr.cells[1].textContent));
    await page.waitForFunction(() => {
      const cells = [...document.querySelectorAll("#tasks-body tr[data-task]")].map((tr) => tr.cells[1].textContent);
      return cells.length === 20 && cells.every((st) => st === "completed");
    });
    const newest = await rows.first().getAttribute("data-task");
    await tabTo("#page-older");
    await assertFocusVisible("the Older button");
    await page.keyboard.press("Enter");
    await page.waitForURL(/after=task_/);
    await page.waitForFunction((first) =>
      document.querySelector("#tasks-body tr[data-task]")?.dataset.task !== first, newest);
    assert.ok((await statuses()).every((st) => st === "completed"));
    await tabTo("#page-newer", { back: true });
    await page.keyboard.press("Enter");
    await page.waitForURL(/\/console\/tasks\?status=completed$/);
    await page.waitForFunction((first) =>
      document.querySelector("#tasks-body tr[data-task]")?.dataset.task === first, newest);
  });

  await step("keyboard only: Cancel asks first; Escape keeps the task, Enter on the confirm cancels it", async () => {
    const created = await call("POST", "/v1/responses", {
      model: "reference", input: "A long story", background: true, max_output_tokens: 100000,
    });
    const taskId = created.json.task_id;
    await page.goto(`${base}/console/tasks/${taskId}`);
    await page.locator('#timeline li[data-type="response.in_progress"]').waitFor();
    await tabTo("#cancel");
    await assertFocusVisible("the Cancel button");
    await page.keyboard.press("Enter");
    const dialog = page.locator("dialog.confirm[open]");
    await dialog.waitFor();
    assert.equal(await page.evaluate(() => document.activeElement?.id), "confirm-no", "the safe choice first");
    await page.keyboard.press("Escape");
    await dialog.waitFor({ state: "detached" });
    assert.equal((await call("GET", `/v1/tasks/${taskId}`)).json.status, "running", "Escape cancelled nothing");
    assert.equal(await page.evaluate(() => document.activeElement?.id), "cancel", "the focus is back on Cancel");
    await page.keyboard.press("Enter");
    await dialog.waitFor();
    await tabTo("#confirm-yes");
    await assertFocusVisible("the confirm button");
    await page.keyboard.press("Enter");
    await page.locator('#task-status[data-status="cancelled"]').waitFor();
    assert.equal((await call("GET", `/v1/tasks/${taskId}`)).json.status, "cancelled");
  });

  await step("log out: the token is gone and the login form is back", async () => {
    await page.click("#logout");
    await page.waitForURL(/\/console\/login$/);
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  });

  await step("a read-only token sees no Submit, Models, Clients or Webhooks", async () => {
    const pairing = await call("POST", "/v1/pairings", { scopes: ["responses:read"] });
    const paired = await fetch(`${base}/v1/pair`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ code: pairing.json.code, name: "reader", scopes: ["responses:read"] }),
    });
    const token = (await paired.json()).token;
    await page.fill("#token", token);
    await page.click("#login button[type=submit]");
    await page.waitForURL(/\/console\/$/);
    await page.locator("#service-id").waitFor();
    const navLink = (name) => page.locator("#nav").getByRole("link", { name, exact: true });
    assert.ok(await navLink("Tasks").isVisible());
    assert.ok(await navLink("Batches").isVisible());
    for (const name of ["Submit", "Models", "Clients", "Webhooks"]) assert.ok(await navLink(name).isHidden(), name);
    assert.match(await page.textContent("#who"), /signed in · responses:read$/);
    await page.locator('#counts [data-status="completed"]').waitFor();
    await page.locator('#engine-health[data-status="ok"]').waitFor();
    // Typed in, the admin page only says what it needs.
    await page.goto(`${base}/console/webhooks`);
    await page.locator("#main .note.error").getByText("This page needs the admin scope.").waitFor();
  });

  await step("no console errors and no CSP violations", async () => {
    // Over the whole run, log out and the read-only token included.
    assert.deepEqual(problems, []);
  });
} catch (error) {
  failed = true;
  console.error(`not ok - ${error.stack ?? error}`);
  if (problems.length) console.error(`browser problems:\n${problems.join("\n")}`);
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  dropConnections();
  proxy.close();
  receiver.closeAllConnections?.();
  receiver.close();
}
process.exit(failed ? 1 : 0);
