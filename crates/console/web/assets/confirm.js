// A confirmation in a modal <dialog> (keyboard: Tab between the buttons, Escape cancels).
import { h } from "./dom.js";

export function confirmDialog(question, action = "Confirm") {
  return new Promise((resolve) => {
    const yes = h("button", { type: "button", class: "danger", id: "confirm-yes" }, action);
    const no = h("button", { type: "button", id: "confirm-no" }, "Keep");
    const dialog = h("dialog", { class: "confirm", "aria-labelledby": "confirm-q" },
      h("p", { id: "confirm-q" }, question), h("div", { class: "actions" }, no, yes));
    const done = (answer) => { dialog.close(); dialog.remove(); resolve(answer); };
    yes.addEventListener("click", () => done(true));
    no.addEventListener("click", () => done(false));
    dialog.addEventListener("cancel", (event) => { event.preventDefault(); done(false); });
    document.body.append(dialog);
    dialog.showModal();
    no.focus();
  });
}
