// Line charts as SVG, drawn by hand: integer step ticks on x, hover shows every series' value at that step.
// Series names and values are set as text (textContent), never markup.
"use strict";
const SVGNS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fde", "#e07b39", "#1e8e3e", "#b06ab3", "#c0392b", "#0f9bb0", "#8a6d3b", "#667085"];

function svg(tag, attrs) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function niceTicks(lo, hi, count, integer) {
  if (!(hi > lo)) { hi = lo + 1; }
  let step = Math.pow(10, Math.floor(Math.log10((hi - lo) / count)));
  for (const m of [1, 2, 5, 10]) { if ((hi - lo) / (step * m) <= count) { step *= m; break; } }
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) ticks.push(+t.toPrecision(12));
  return ticks;
}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return String(+v.toPrecision(4));
}

// series: [{name, points: [[step, value], ...], color?, dashed?}]
function lineChart(title, series) {
  const W = 380, H = 180, L = 46, R = 8, T = 8, B = 22;
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.title = title;
  const h = document.createElement("h3"); h.textContent = title; box.appendChild(h);
  const all = series.flatMap(s => s.points).filter(p => p[1] !== null && Number.isFinite(p[1]));
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none"});
  box.appendChild(root);
  if (!all.length) {
    const t = svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}); t.textContent = "no values yet";
    root.appendChild(t); return box;
  }
  let [x0, x1] = [Math.min(...all.map(p => p[0])), Math.max(...all.map(p => p[0]))];
  let [y0, y1] = [Math.min(...all.map(p => p[1])), Math.max(...all.map(p => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 0.5; y1 += Math.abs(y1) * 0.1 || 0.5; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (const t of niceTicks(y0, y1, 4, false)) {
    root.appendChild(svg("line", {x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid"}));
    const label = svg("text", {x: L - 4, y: sy(t) + 3, "text-anchor": "end"}); label.textContent = fmt(t);
    root.appendChild(label);
  }
  for (const t of niceTicks(x0, x1, 6, true)) {
    const label = svg("text", {x: sx(t), y: H - 6, "text-anchor": "middle"}); label.textContent = String(t);
    root.appendChild(label);
  }
  root.appendChild(svg("line", {x1: L, x2: L, y1: T, y2: H - B, class: "axis"}));
  root.appendChild(svg("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis"}));
  series.forEach((s, i) => {
    s.color = s.color || PALETTE[i % PALETTE.length];
    const pts = s.points.filter(p => p[1] !== null && Number.isFinite(p[1]));
    if (!pts.length) return;
    const d = pts.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    root.appendChild(svg("path", {d, fill: "none", stroke: s.color, "stroke-width": 1.6,
                                  "stroke-dasharray": s.dashed ? "4 3" : "none", "vector-effect": "non-scaling-stroke",
                                  class: "series"}));
  });
  const cursor = svg("line", {y1: T, y2: H - B, stroke: "#98a2b3", visibility: "hidden"});
  root.appendChild(cursor);
  const tip = document.createElement("div"); tip.className = "tip"; box.appendChild(tip);
  root.addEventListener("mousemove", ev => {
    const rect = root.getBoundingClientRect();
    const x = x0 + ((ev.clientX - rect.left) / rect.width * W - L) / (W - L - R) * (x1 - x0);
    const step = Math.round(Math.min(x1, Math.max(x0, x)));
    cursor.setAttribute("x1", sx(step)); cursor.setAttribute("x2", sx(step)); cursor.setAttribute("visibility", "visible");
    const lines = [`step ${step}`];
    for (const s of series) {
      const hit = s.points.find(p => p[0] === step);
      lines.push(`${s.name}: ${hit ? fmt(hit[1]) : "–"}`);
    }
    tip.textContent = lines.join("\n");
    tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX - rect.left + 12, rect.width - 140) + "px";
    tip.style.top = "24px";
  });
  root.addEventListener("mouseleave", () => { tip.style.display = "none"; cursor.setAttribute("visibility", "hidden"); });
  if (series.length > 1) box.appendChild(legend(series));
  return box;
}

function chartBox(title, id) {
  const box = document.createElement("div");
  box.className = "chart"; box.dataset.title = title; if (id) box.dataset.panel = id;
  const h = document.createElement("h3"); h.textContent = title; box.appendChild(h);
  const tip = document.createElement("div"); tip.className = "tip"; box.appendChild(tip);
  return [box, tip];
}

function showTip(tip, root, ev, lines) {
  const rect = root.getBoundingClientRect();
  tip.textContent = lines.join("\n");
  tip.style.display = "block";
  tip.style.left = Math.min(ev.clientX - rect.left + 12, Math.max(0, rect.width - 160)) + "px";
  tip.style.top = "24px";
}

// Grouped bars, one group per category; hover over a group shows every series' value in it.
// series: [{name, values: [number|null per category]}]
function barChart(title, categories, series, id) {
  const W = 380, H = 180, L = 46, R = 8, T = 8, B = 22;
  const [box, tip] = chartBox(title, id);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none"});
  box.insertBefore(root, tip);
  const values = series.flatMap(s => s.values).filter(v => v !== null && Number.isFinite(v));
  if (!categories.length || !values.length) {
    const t = svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}); t.textContent = "nothing scored";
    root.appendChild(t); return box;
  }
  let y0 = Math.min(0, ...values), y1 = Math.max(0, ...values);
  if (y1 === y0) y1 = y0 + 1;
  const sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const integer = values.every(Number.isInteger);
  for (const t of niceTicks(y0, y1, 4, integer)) {
    root.appendChild(svg("line", {x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid"}));
    const label = svg("text", {x: L - 4, y: sy(t) + 3, "text-anchor": "end"}); label.textContent = fmt(t);
    root.appendChild(label);
  }
  const band = (W - L - R) / categories.length, barW = band * 0.8 / series.length;
  const every = Math.max(1, Math.ceil(categories.length / 12));
  categories.forEach((c, i) => {
    series.forEach((s, j) => {
      const v = s.values[i];
      if (v === null || !Number.isFinite(v) || v === 0) return;   // zero: no bar; the hover still says 0
      root.appendChild(svg("rect", {x: L + band * i + band * 0.1 + barW * j, width: Math.max(barW - 1, 0.5),
        y: Math.min(sy(v), sy(0)), height: Math.max(Math.abs(sy(v) - sy(0)), 0.5),
        fill: PALETTE[j % PALETTE.length], class: "bar"}));
    });
    if (i % every === 0) {
      const label = svg("text", {x: L + band * (i + 0.5), y: H - 6, "text-anchor": "middle"});
      label.textContent = String(c); root.appendChild(label);
    }
  });
  root.appendChild(svg("line", {x1: L, x2: W - R, y1: sy(0), y2: sy(0), class: "axis"}));
  root.addEventListener("mousemove", ev => {
    const rect = root.getBoundingClientRect();
    const i = Math.floor(((ev.clientX - rect.left) / rect.width * W - L) / band);
    if (i < 0 || i >= categories.length) { tip.style.display = "none"; return; }
    showTip(tip, root, ev, [String(categories[i]), ...series.map(s => `${s.name}: ${fmt(s.values[i])}`)]);
  });
  root.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  if (series.length > 1) box.appendChild(legend(series));
  return box;
}

// Counts of (row level, column level) pairs as shaded cells with the count written in; hover names the pair.
function heatmap(title, levels, counts, rowName, colName, id) {
  const W = 380, H = 180, L = 46, T = 8, B = 22;
  const [box, tip] = chartBox(title, id);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none"});
  box.insertBefore(root, tip);
  const n = levels.length, most = Math.max(1, ...counts.flat());
  const cw = (W - L - 8) / Math.max(n, 1), ch = (H - T - B) / Math.max(n, 1);
  counts.forEach((row, i) => row.forEach((count, j) => {
    root.appendChild(svg("rect", {x: L + j * cw, y: T + i * ch, width: cw - 1, height: ch - 1, class: "cell",
      fill: `rgba(47,111,222,${(0.08 + 0.92 * count / most).toFixed(3)})`}));
    const t = svg("text", {x: L + (j + 0.5) * cw, y: T + (i + 0.5) * ch + 3, "text-anchor": "middle"});
    if (count / most > 0.5) t.style.fill = "#fff";
    t.textContent = String(count); root.appendChild(t);
  }));
  levels.forEach((v, i) => {
    const r = svg("text", {x: L - 4, y: T + (i + 0.5) * ch + 3, "text-anchor": "end"}); r.textContent = fmt(v);
    const c = svg("text", {x: L + (i + 0.5) * cw, y: H - 6, "text-anchor": "middle"}); c.textContent = fmt(v);
    root.append(r, c);
  });
  root.addEventListener("mousemove", ev => {
    const rect = root.getBoundingClientRect();
    const j = Math.floor(((ev.clientX - rect.left) / rect.width * W - L) / cw);
    const i = Math.floor(((ev.clientY - rect.top) / rect.height * H - T) / ch);
    if (i < 0 || j < 0 || i >= n || j >= n) { tip.style.display = "none"; return; }
    showTip(tip, root, ev, [`${rowName} ${fmt(levels[i])}, ${colName} ${fmt(levels[j])}: ${counts[i][j]} items`]);
  });
  root.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  return box;
}

function legend(series) {
  const box = document.createElement("div"); box.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("span"); const swatch = document.createElement("i");
    swatch.style.background = s.color || PALETTE[i % PALETTE.length];
    item.appendChild(swatch); item.appendChild(document.createTextNode(s.name)); box.appendChild(item);
  });
  return box;
}

window.stropCharts = {lineChart, barChart, heatmap, fmt};
