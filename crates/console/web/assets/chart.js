// A small inline SVG chart: bars for a series of numbers, with its latest value and maximum.
import { h, s } from "./dom.js";

export function chart(title, values, { unit = "", width = 240, height = 60 } = {}) {
  const max = Math.max(1, ...values);
  const n = Math.max(values.length, 1);
  const step = width / n;
  const bars = values.map((v, i) => {
    const bh = Math.round((v / max) * (height - 2));
    return s("rect", {
      x: (i * step).toFixed(1), y: height - bh, width: Math.max(step - 1, 1).toFixed(1),
      height: bh, class: "bar",
    }, s("title", {}, `${v.toFixed(v % 1 ? 1 : 0)}${unit}`));
  });
  const last = values.length ? values[values.length - 1] : 0;
  const svg = s("svg", {
    viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": `${title}: latest ${last.toFixed(1)}${unit}, max ${max.toFixed(1)}${unit}`,
    class: "chart",
  }, s("line", { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, class: "axis" }), bars);
  return h("figure", { class: "chartbox" },
    h("figcaption", {}, title, " ", h("strong", {}, `${last.toFixed(last % 1 ? 1 : 0)}${unit}`),
      h("span", { class: "muted" }, ` (max ${max.toFixed(max % 1 ? 1 : 0)})`)),
    svg);
}
