// Building the page without ever parsing HTML: every element is created with createElement and
// every piece of text (above all, anything that came from the API) goes in as a text node.
// Under the console's Trusted Types policy an HTML string sink would throw anyway.

/** An element: h("a", {href, class, onclick}, "text", child, …). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.setAttribute("class", value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/**
 * A local time for an RFC 3339 string (with its milliseconds) or Unix seconds (whole seconds:
 * they have no milliseconds to show), "—" for none.
 */
export function time(value) {
  if (value === null || value === undefined) return "—";
  const seconds = typeof value === "number";
  const date = seconds ? new Date(value * 1000) : new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  const text = date.toLocaleString(undefined, { hour12: false });
  return seconds ? text : `${text}.${String(date.getMilliseconds()).padStart(3, "0")}`;
}

/** A byte count, human-sized. */
export function bytes(n) {
  if (typeof n !== "number") return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

/** A status badge. */
export function badge(status) {
  return h("span", { class: `badge st-${String(status).replace(/[^a-z_]/g, "")}` }, status);
}

/** A message line: kind is "error", "info" or "ok". */
export function note(kind, text) {
  return h("p", { class: `note ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

/** Seconds as "1d 2h 3m 4s". */
export function duration(seconds) {
  if (typeof seconds !== "number") return "—";
  const parts = [];
  let rest = Math.round(seconds);
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (rest >= size || (unit === "s" && parts.length === 0)) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
  }
  return parts.join(" ");
}
