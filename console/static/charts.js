// Line charts drawn as SVG: lineChart(values, times) -> an <svg> element.
// values may hold nulls (no sample yet); the y axis starts at 0 and ends at a round maximum.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function lineChart(values, times) {
  const W = 320, H = 110, L = 34, R = 4, T = 6, B = 16;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  const known = values.filter((v) => v !== null && v !== undefined);
  const top = niceMax(Math.max(0, ...known));
  for (const frac of [0, 0.5, 1]) {
    const y = T + (H - T - B) * (1 - frac);
    svg.appendChild(svgEl("line", { class: "grid", x1: L, x2: W - R, y1: y, y2: y }));
    const label = svgEl("text", { x: L - 4, y: y + 3, "text-anchor": "end" });
    label.textContent = formatNumber(top * frac);
    svg.appendChild(label);
  }
  const n = values.length;
  const points = [];
  values.forEach((v, i) => {
    if (v === null || v === undefined) return;
    const x = L + (W - L - R) * (n > 1 ? i / (n - 1) : 1);
    const y = T + (H - T - B) * (1 - v / top);
    points.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  svg.appendChild(svgEl("polyline", { points: points.join(" ") }));
  if (times && times.length > 1) {
    const span = Math.round(times[times.length - 1] - times[0]);
    const label = svgEl("text", { x: L, y: H - 3 });
    label.textContent = `last ${span} s`;
    svg.appendChild(label);
  }
  return svg;
}

function formatNumber(v) {
  if (v === null || v === undefined) return "–";
  if (v >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k`;
  if (v >= 10 || v === 0) return String(Math.round(v));
  return v.toFixed(1);
}
