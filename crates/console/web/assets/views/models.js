// Models: id, size, digest, format; register a file from the models directory; delete.
import { api } from "../api.js";
import { h, note, replace, time, bytes } from "../dom.js";
import { confirmDialog } from "../confirm.js";

export function render(main, ctx) {
  const body = h("tbody", { id: "models-body" });
  const messages = h("div", { "aria-live": "polite" });
  const canWrite = ctx.can("models:write");
  main.append(h("h1", {}, "Models"), messages,
    h("div", { class: "scroll" }, h("table", { id: "models-table" },
      h("thead", {}, h("tr", {}, ["Model", "Format", "Size", "Digest", "Path", "Registered", ""]
        .map((c) => h("th", { scope: "col" }, c)))),
      body)));

  async function load() {
    try {
      const list = await api("/v1/models");
      replace(body, list.data.map((m) => h("tr", { "data-model": m.id },
        h("td", {}, h("code", {}, m.id)),
        h("td", {}, m.format ?? (m.upstream_model ? "upstream" : "—")),
        h("td", { class: "num" }, bytes(m.size_bytes)),
        h("td", {}, h("code", { class: "digest", title: m.digest ?? "" }, m.digest ?? "—")),
        h("td", {}, m.path ?? m.upstream_model ?? "—"),
        h("td", {}, time(m.created_at ?? m.created)),
        h("td", {}, canWrite ? h("button", { type: "button", class: "danger",
          onclick: () => remove(m.id) }, "Delete") : null))));
    } catch (error) {
      replace(messages, note("error", `Could not list models: ${error.message}`));
    }
  }

  async function remove(id) {
    if (!await confirmDialog(`Delete the model ${id}? The file itself is not touched.`, "Delete")) return;
    try {
      await api(`/v1/models/${encodeURIComponent(id)}`, { method: "DELETE" });
      replace(messages, note("ok", `Deleted ${id}.`));
    } catch (error) {
      replace(messages, note("error", `Not deleted: ${error.message}`));
    }
    load();
  }

  if (canWrite) {
    const id = h("input", { id: "m-id", name: "id", required: true, autocomplete: "off" });
    const path = h("input", { id: "m-path", name: "path", required: true, autocomplete: "off",
      placeholder: "/path/inside/--models-dir/model.gguf" });
    const form = h("form", { class: "card", id: "model-form" },
      h("h2", {}, "Register a model file"),
      h("p", { class: "muted" }, "The file must be a .gguf or .txt file inside the service's --models-dir. The service hashes it; the file stays where it is."),
      h("label", { for: "m-id" }, "Id"), id,
      h("label", { for: "m-path" }, "Path"), path,
      h("button", { type: "submit" }, "Register"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      replace(messages, note("info", "Hashing…"));
      try {
        const model = await api("/v1/models", { method: "POST",
          body: { id: id.value.trim(), path: path.value.trim() } });
        replace(messages, note("ok", `Registered ${model.id} (${model.digest}).`));
        form.reset();
      } catch (error) {
        replace(messages, note("error", `Not registered: ${error.message}`));
      }
      load();
    });
    main.append(form);
  }
  load();
}
