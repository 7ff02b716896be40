// Clients (admin): list, revoke with confirmation, create a pairing code with its countdown.
import { api } from "../api.js";
import { h, note, replace, time } from "../dom.js";
import { confirmDialog } from "../confirm.js";

const SCOPES = ["responses:write", "responses:read", "models:read", "models:write", "admin"];

export function render(main) {
  const body = h("tbody", { id: "clients-body" });
  const messages = h("div", { "aria-live": "polite" });
  const pairing = h("div", { id: "pairing" });
  const boxes = SCOPES.map((scope) => h("label", { class: "check" },
    h("input", { type: "checkbox", name: "scope", value: scope,
      checked: scope === "responses:read" || scope === "responses:write" || scope === "models:read" }),
    ` ${scope}`));
  const form = h("form", { class: "card", id: "pairing-form" },
    h("h2", {}, "Pair a new client"),
    h("p", { class: "muted" }, "A one-time code, valid 10 minutes: the new client sends it to POST /v1/pair with its name and the scopes it wants (a subset of these)."),
    h("fieldset", {}, h("legend", {}, "Scopes"), boxes),
    h("button", { type: "submit" }, "Create pairing code"),
    pairing);
  main.append(h("h1", {}, "Clients"), messages,
    h("div", { class: "scroll" }, h("table", { id: "clients-table" },
      h("thead", {}, h("tr", {}, ["Client", "Name", "Scopes", "Created", "Revoked", ""]
        .map((c) => h("th", { scope: "col" }, c)))),
      body)),
    form);

  async function load() {
    try {
      const list = await api("/v1/clients");
      replace(body, list.data.map((c) => h("tr", { "data-client": c.id },
        h("td", {}, h("code", {}, c.id)),
        h("td", {}, c.name),
        h("td", {}, c.scopes.join(", ")),
        h("td", {}, time(c.created_at)),
        h("td", {}, time(c.revoked_at)),
        h("td", {}, c.revoked_at ? null : h("button", { type: "button", class: "danger revoke",
          onclick: () => revoke(c) }, "Revoke")))));
    } catch (error) {
      replace(messages, note("error", `Could not list clients: ${error.message}`));
    }
  }

  async function revoke(client) {
    const yes = await confirmDialog(
      `Revoke ${client.name} (${client.id})? Its token stops working at once.`, "Revoke");
    if (!yes) return;
    try {
      await api(`/v1/clients/${encodeURIComponent(client.id)}`, { method: "DELETE" });
      replace(messages, note("ok", `Revoked ${client.name}.`));
    } catch (error) {
      replace(messages, note("error", `Not revoked: ${error.message}`));
    }
    load();
  }

  let timer = null;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const scopes = boxes.map((label) => label.querySelector("input")).filter((i) => i.checked).map((i) => i.value);
    try {
      const code = await api("/v1/pairings", { method: "POST", body: { scopes } });
      const countdown = h("p", { id: "pairing-countdown", class: "countdown", "aria-live": "off" });
      replace(pairing, h("p", { class: "muted" }, "Pairing code for ", scopes.join(", ")),
        h("output", { id: "pairing-code", class: "code" }, code.code), countdown);
      const expires = new Date(code.expires_at).getTime();
      clearInterval(timer);
      const tick = () => {
        const left = Math.max(0, Math.round((expires - Date.now()) / 1000));
        countdown.textContent = left > 0
          ? `expires in ${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")}` : "expired";
        if (left === 0) clearInterval(timer);
      };
      tick();
      timer = setInterval(tick, 1000);
    } catch (error) {
      replace(pairing, note("error", `No code: ${error.message}`));
    }
  });
  load();
  return () => clearInterval(timer);
}
