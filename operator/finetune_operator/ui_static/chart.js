// A small SVG line chart for the curves of status.history: x is the training step, y the value; each series is drawn
// per attempt (a gang restart may resume from an earlier step), and the start of every attempt after the first is
// marked with a dashed line. No dependencies; nothing is fetched.
"use strict";
window.FinetuneChart = (function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640, H = 240, PAD = { left: 58, right: 14, top: 14, bottom: 30 };

  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function ticks(lo, hi, n) {
    if (hi === lo) return [lo];
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e4 || a < 1e-2 ? v.toExponential(1) : Number(v.toPrecision(3)).toString();
  }

  // spec: {title, series: [{name, color, points: [[attempt, step, value], ...], dots}], marks: [{attempt, step}]}
  function draw(container, spec) {
    const all = spec.series.flatMap((s) => s.points);
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.chart = spec.title;
    const head = document.createElement("div");
    head.className = "legend";
    const title = document.createElement("strong");
    title.textContent = spec.title;
    head.appendChild(title);
    for (const s of spec.series) {
      const key = document.createElement("i");
      key.style.background = s.color;
      head.appendChild(key);
      head.appendChild(document.createTextNode(s.name));
    }
    box.appendChild(head);
    container.appendChild(box);
    if (all.length === 0) {
      const empty = document.createElement("p");
      empty.className = "muted";
      empty.textContent = "no points yet (the operator records them from rank 0's metrics as the job trains)";
      box.appendChild(empty);
      return box;
    }
    const xs = all.map((p) => p[1]), ys = all.map((p) => p[2]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const pad = (y1 - y0) * 0.05;
    y0 -= pad; y1 += pad;
    const X = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const Y = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": spec.title });
    for (const t of ticks(y0, y1, 4)) {
      svg.appendChild(el("line", { x1: PAD.left, x2: W - PAD.right, y1: Y(t), y2: Y(t), stroke: "#eceff3" }));
      svg.appendChild(el("text", { x: PAD.left - 6, y: Y(t) + 4, "text-anchor": "end", "font-size": 11, fill: "#6b7385" }, fmt(t)));
    }
    for (const t of ticks(x0, x1, 6)) {
      svg.appendChild(el("text", { x: X(t), y: H - PAD.bottom + 16, "text-anchor": "middle", "font-size": 11, fill: "#6b7385" }, fmt(t)));
    }
    svg.appendChild(el("text", { x: W - PAD.right, y: H - 4, "text-anchor": "end", "font-size": 11, fill: "#6b7385" }, "step"));
    svg.appendChild(el("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, stroke: "#9aa3b2" }));
    for (const m of spec.marks || []) {
      const g = el("g", { class: "attempt-mark", "data-attempt": m.attempt });
      g.appendChild(el("line", { x1: X(m.step), x2: X(m.step), y1: PAD.top, y2: H - PAD.bottom, stroke: "#b26a00", "stroke-dasharray": "4 3" }));
      g.appendChild(el("text", { x: X(m.step) + 3, y: PAD.top + 10, "font-size": 11, fill: "#b26a00" }, `attempt ${m.attempt}`));
      svg.appendChild(g);
    }
    for (const s of spec.series) {
      const byAttempt = new Map();
      for (const p of s.points) {
        if (!byAttempt.has(p[0])) byAttempt.set(p[0], []);
        byAttempt.get(p[0]).push(p);
      }
      for (const [attempt, points] of byAttempt) {
        const d = points.map((p) => `${X(p[1]).toFixed(1)},${Y(p[2]).toFixed(1)}`).join(" ");
        svg.appendChild(el("polyline", {
          points: d, fill: "none", stroke: s.color, "stroke-width": 2,
          "data-series": s.name, "data-attempt": attempt, "data-points": points.length,
        }));
        if (s.dots || points.length === 1) {
          for (const p of points) svg.appendChild(el("circle", { cx: X(p[1]), cy: Y(p[2]), r: 3, fill: s.color }));
        }
      }
    }
    box.appendChild(svg);
    return box;
  }

  return { draw };
})();
