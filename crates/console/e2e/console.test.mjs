// The web console in a real browser: Debian's /usr/bin/chromium driven by playwright-core
// against a running `lmsp serve` (started by crates/lmsp/tests/console_browser.rs).
//
// Env: LMSP_BASE_URL (http://127.0.0.1:PORT), LMSP_ADMIN_TOKEN, optional LMSP_SCREENSHOTS (a
// directory: one PNG per view). Exits 0 when every step passed; prints each step.
import { chromium } from "playwright-core";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import net from "node:net";

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

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-dev-shm-usage"],
});
const problems = [];
let failed = false;
try {
  const context = await browser.newContext({ viewport: { width: 1200, height: 860 } });
  const page = await context.newPage();
  page.setDefaultTimeout(20000);
  page.on("console", (msg) => {
    if (msg.type() === "error") problems.push(`console error: ${msg.text()} at ${msg.location().url}`);
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
  await step("overview shows the service id, version and live counts", async () => {
    await page.locator("#service-id").getByText(service.id).waitFor();
    assert.equal(await page.textContent("#service-version"), service.version);
    await page.locator('#counts [data-status="queued"]').waitFor();
    await page.locator("#health .st-ok").waitFor();
    await page.locator("svg.chart").first().waitFor();
    // Every nav entry shows for an admin.
    for (const name of ["Tasks", "Submit", "Models", "Clients"]) {
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
    const created = await call("POST", "/v1/responses", {
      model: "reference", input: "The forest", background: true, max_output_tokens: 60,
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
    await page.locator('#stream-state[data-state="live"], #task-status[data-status="completed"]').first().waitFor();
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
    dropConnections();
    await page.locator('#task-status[data-status="completed"]').waitFor();
    await page.locator('#timeline li[data-type="response.completed"]').waitFor();
    page.off("request", onRequest);
    assert.ok(streams.length >= 2, `the stream was not reopened: ${streams}`);
    assert.equal(streams[0], 0);
    assert.ok(streams[1] > 0, `the second stream did not resume by sequence number: ${streams}`);
    const response = (await call("GET", `/v1/responses/${created.json.id}`)).json;
    assert.equal(await page.textContent("#output"), response.output_text);
    const seqs = await page.locator("#timeline li").evaluateAll((items) => items.map((li) => Number(li.dataset.seq)));
    assert.deepEqual(seqs, [...new Set(seqs)].sort((a, b) => a - b), "no event shown twice");
  });
  // A cut connection may be logged by the browser as a failed load: expected in that step only.
  for (let i = problems.length - 1; i >= 0; i -= 1) {
    if (/Failed to load resource: net::ERR_/.test(problems[i])) problems.splice(i, 1);
  }

  await step("models: the list shows the reference model with its digest", async () => {
    await nav("Models");
    const row = page.locator('#models-body tr[data-model="reference"]');
    await row.waitFor();
    assert.match(await row.textContent(), /sha256:/);
    await shot("models");
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

  await step("keyboard only: Tab reaches the nav and Enter opens a view", async () => {
    await page.goto(`${base}/console/`);
    await page.locator("#service-id").waitFor();
    let reached = false;
    for (let i = 0; i < 12 && !reached; i += 1) {
      await page.keyboard.press("Tab");
      reached = await page.evaluate(() => document.activeElement?.textContent === "Tasks");
    }
    assert.ok(reached, "Tab never reached the Tasks link");
    await page.keyboard.press("Enter");
    await page.waitForURL(/\/console\/tasks$/);
    await page.locator("#tasks-body tr").first().waitFor();
  });

  await step("no console errors and no CSP violations", async () => {
    assert.deepEqual(problems, []);
  });

  await step("log out: the token is gone and the login form is back", async () => {
    await page.click("#logout");
    await page.waitForURL(/\/console\/login$/);
    assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  });

  await step("a read-only token sees no Submit, Models or Clients", async () => {
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
    for (const name of ["Submit", "Models", "Clients"]) assert.ok(await navLink(name).isHidden(), name);
  });
} catch (error) {
  failed = true;
  console.error(`not ok - ${error.stack ?? error}`);
  if (problems.length) console.error(`browser problems:\n${problems.join("\n")}`);
} finally {
  await browser.close();
  dropConnections();
  proxy.close();
}
process.exit(failed ? 1 : 0);
