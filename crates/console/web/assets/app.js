// The console's shell: log in, find out what the token may do, route between the views.
import { api, session, whenUnauthorized, ApiError } from "./api.js";
import { h, note, replace } from "./dom.js";
import * as overview from "./views/overview.js";
import * as tasks from "./views/tasks.js";
import * as task from "./views/task.js";
import * as batches from "./views/batches.js";
import * as submit from "./views/submit.js";
import * as models from "./views/models.js";
import * as clients from "./views/clients.js";
import * as webhooks from "./views/webhooks.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const logoutButton = document.getElementById("logout");

/** What the signed-in token may do, and the service it talks to. */
const ctx = {
  scopes: new Set(),
  service: null,
  can(scope) { return this.scopes.has("admin") || this.scopes.has(scope); },
  go(path) { navigate(path); },
};

let cleanup = null;

/**
 * The token's scopes, as the service object names them (`caller.scopes`): the console learns
 * what it may do without trying (a refused call would log an error in the browser's console).
 */
function scopesOf(service) {
  return new Set(service.caller?.scopes ?? []);
}

async function signIn() {
  ctx.service = await api("/v1/service");
  ctx.scopes = scopesOf(ctx.service);
  nav.hidden = false;
  logoutButton.hidden = false;
  for (const link of nav.querySelectorAll("a[data-scope]")) {
    link.hidden = !ctx.can(link.dataset.scope);
  }
  const names = ctx.scopes.has("admin") ? "admin" : [...ctx.scopes].join(", ") || "no scopes";
  replace(who, h("span", { class: "muted" }, "signed in · "), names);
}

function signOut(message) {
  session.clear();
  ctx.scopes = new Set();
  ctx.service = null;
  nav.hidden = true;
  logoutButton.hidden = true;
  replace(who);
  navigate("/console/login", message);
}

whenUnauthorized(() => {
  if (session.token()) signOut("The token was refused (unknown or revoked). Paste another.");
});

logoutButton.addEventListener("click", () => signOut("Logged out."));

function loginView(message) {
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "off", spellcheck: "false",
    required: true, placeholder: "lmsp_…", "aria-describedby": "token-help",
  });
  const status = h("div", { "aria-live": "polite" });
  const form = h("form", { class: "card login", id: "login" },
    h("h1", {}, "Log in"),
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { id: "token-help", class: "muted" },
      "Paste a token (lmsp_…). It is kept in this tab's sessionStorage only and sent as ",
      h("code", {}, "Authorization: Bearer"), " on each API call."),
    h("button", { type: "submit" }, "Log in"),
    status);
  if (message) status.append(note("info", message));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) return;
    session.save(token);
    replace(status, note("info", "Checking…"));
    try {
      await signIn();
      navigate("/console/");
    } catch (error) {
      session.clear();
      const text = error instanceof ApiError && error.status === 401
        ? "That token is not valid." : `Could not log in: ${error.message}`;
      replace(status, note("error", text));
    }
  });
  replace(main, form);
  input.focus();
}

const VIEWS = [
  { re: /^$/, view: overview, name: "overview" },
  { re: /^tasks$/, view: tasks, name: "tasks", scope: "responses:read" },
  { re: /^tasks\/([^/]+)$/, view: task, name: "tasks", scope: "responses:read" },
  { re: /^batches$/, view: batches, name: "batches", scope: "responses:read" },
  { re: /^batches\/([^/]+)$/, view: batches, name: "batches", scope: "responses:read" },
  { re: /^submit$/, view: submit, name: "submit", scope: "responses:write" },
  { re: /^models$/, view: models, name: "models", scope: "models:read" },
  { re: /^clients$/, view: clients, name: "clients", scope: "admin" },
  { re: /^webhooks$/, view: webhooks, name: "webhooks", scope: "admin" },
  { re: /^webhooks\/([^/]+)$/, view: webhooks, name: "webhooks", scope: "admin" },
];

async function render(message) {
  if (cleanup) { cleanup(); cleanup = null; }
  const path = location.pathname.replace(/^\/console\/?/, "").replace(/\/$/, "");
  if (!session.token()) {
    if (path !== "login") history.replaceState(null, "", "/console/login");
    loginView(message);
    return;
  }
  if (!ctx.service) {
    try {
      await signIn();
    } catch (error) {
      if (!session.token()) return;
      replace(main, note("error", `The service did not answer: ${error.message}`));
      return;
    }
  }
  if (path === "login") { history.replaceState(null, "", "/console/"); return render(); }
  const route = VIEWS.find((r) => r.re.test(path));
  for (const link of nav.querySelectorAll("a")) {
    if (route && link.dataset.view === route.name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  main.replaceChildren();
  if (!route) { main.append(note("error", "No such page.")); return; }
  if (route.scope && !ctx.can(route.scope)) {
    main.append(note("error", `This page needs the ${route.scope} scope.`));
    return;
  }
  const args = path.match(route.re).slice(1).map(decodeURIComponent);
  const params = new URLSearchParams(location.search);
  cleanup = route.view.render(main, ctx, args, params) ?? null;
  document.title = `LMSP · ${route.name}`;
}

function navigate(path, message) {
  if (path !== location.pathname + location.search) history.pushState(null, "", path);
  render(message);
  main.focus({ preventScroll: true });
}

document.addEventListener("click", (event) => {
  const link = event.target.closest?.("a[href]");
  if (!link || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  if (link.target || link.hasAttribute("download")) return;
  const url = new URL(link.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith("/console")) return;
  event.preventDefault();
  navigate(url.pathname + url.search);
});

window.addEventListener("popstate", () => render());
render();
