// Submit a prompt (model, on_restart, max tokens) and watch it stream.
import { api } from "../api.js";
import { h, note, replace } from "../dom.js";
import { taskPanel } from "./task.js";

export function render(main, ctx) {
  const model = h("select", { id: "s-model", name: "model", required: true });
  const input = h("textarea", { id: "s-input", name: "input", rows: 4, required: true,
    placeholder: "Once upon a time" });
  const policy = h("select", { id: "s-restart", name: "on_restart" },
    h("option", { value: "" }, `service default (${ctx.service.default_on_restart})`),
    ["fail", "retry", "resume"].map((p) => h("option", { value: p }, p)));
  const tokens = h("input", { id: "s-tokens", name: "max_output_tokens", type: "number", min: 1,
    max: 100000, value: 64 });
  const button = h("button", { type: "submit" }, "Submit");
  const messages = h("div", { "aria-live": "polite" });
  const live = h("div", { id: "submit-live" });
  const form = h("form", { class: "card submit", id: "submit-form" },
    h("h1", {}, "Submit a prompt"),
    h("label", { for: "s-model" }, "Model"), model,
    h("label", { for: "s-input" }, "Input"), input,
    h("div", { class: "row" },
      h("label", {}, "on_restart ", policy),
      h("label", {}, "max output tokens ", tokens)),
    button, messages);
  main.append(form, live);

  if (ctx.can("models:read")) {
    api("/v1/models").then((list) => {
      replace(model, list.data.map((m) => h("option", { value: m.id }, m.id)));
    }).catch((error) => replace(messages, note("error", `Models: ${error.message}`)));
  } else {
    replace(model, h("option", { value: "reference" }, "reference"));
  }

  let stop = null;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { model: model.value, input: input.value, background: true,
      max_output_tokens: Number(tokens.value) };
    if (policy.value) body.on_restart = policy.value;
    button.disabled = true;
    try {
      const response = await api("/v1/responses", { method: "POST", body });
      if (stop) stop();
      live.replaceChildren();
      live.append(h("section", { class: "card", "aria-labelledby": "prompt-h" },
        h("h2", { id: "prompt-h" }, "Prompt"), h("pre", { id: "submitted-prompt", class: "output" }, body.input)));
      messages.replaceChildren(note("ok", "Submitted. "),
        h("a", { href: `/console/tasks/${encodeURIComponent(response.task_id)}` }, "Open the task page"));
      stop = taskPanel(live, ctx, response.task_id);
    } catch (error) {
      replace(messages, note("error", `Not submitted: ${error.message}`));
    } finally {
      button.disabled = false;
    }
  });
  return () => { if (stop) stop(); };
}
