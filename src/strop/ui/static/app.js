// strop ui: the runs table, a run's page and the models list. Every value from the server is put on the page as
// text (el() makes text nodes of strings; nothing here assigns innerHTML).
"use strict";
const POLL_MS = 1500;
let timers = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path, options) {
  const response = await fetch("/api/" + path, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || ("HTTP " + response.status));
  return body;
}

function every(ms, fn) {
  let stopped = false;
  const tick = async () => {
    if (stopped) return;
    try { await fn(); document.getElementById("status-line").textContent = "updated " + new Date().toLocaleTimeString(); }
    catch (e) { document.getElementById("status-line").textContent = "could not update: " + e.message; }
    if (!stopped) timers.push(setTimeout(tick, ms));
  };
  timers.push({stop: () => { stopped = true; }});
  tick();
}

function stopTimers() {
  for (const t of timers) { if (t && t.stop) t.stop(); else clearTimeout(t); }
  timers = [];
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.round(seconds);
  return s >= 3600 ? `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m` : s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${s}s`;
}

function lineageText(lineage) {
  return (lineage || []).map(x => x.baseModel || x.modelId).join(" → ");
}

function badge(status) { return el("span", {class: "badge " + status}, status); }

// --- runs -------------------------------------------------------------------------------------------------
function runsPage(main, params) {
  const project = el("select", {id: "f-project"}, el("option", {value: ""}, "all projects"));
  const status = el("select", {id: "f-status"}, ["", "pending", "running", "succeeded", "failed", "cancelled", "stopped"]
    .map(s => el("option", {value: s}, s || "any status")));
  const compare = el("button", {id: "compare", onclick: () => {
    const ids = [...document.querySelectorAll("input.pick:checked")].map(c => c.value);
    if (ids.length) location.hash = `#/run/${ids[0]}?with=${ids.slice(1).join(",")}`;
  }}, "overlay selected");
  const body = el("tbody");
  main.append(el("h1", {}, "Runs"), el("div", {class: "filters"}, el("label", {}, "project"), project,
    el("label", {}, "status"), status, compare),
    el("table", {id: "runs"}, el("thead", {}, el("tr", {}, ["", "run", "project", "status", "method", "step",
      "latest reward", "model", "lineage", "duration"].map(h => el("th", {}, h)))), body));
  api("projects").then(r => r.projects.forEach(p => project.appendChild(el("option", {value: p}, p))));
  const picked = new Set();
  project.onchange = status.onchange = () => refresh();
  async function refresh() {
    const q = new URLSearchParams({project: project.value, status: status.value});
    const {runs} = await api("runs?" + q);
    body.replaceChildren(...runs.map(r => {
      const pick = el("input", {type: "checkbox", class: "pick", value: r.runId, checked: picked.has(r.runId),
        onclick: ev => { ev.stopPropagation(); ev.target.checked ? picked.add(r.runId) : picked.delete(r.runId); }});
      return el("tr", {class: "click", "data-run": r.runId, onclick: () => { location.hash = "#/run/" + r.runId; }},
        el("td", {}, pick), el("td", {}, r.runId, r.configName ? el("div", {class: "muted"}, r.configName) : null),
        el("td", {}, r.project), el("td", {}, badge(r.status)), el("td", {}, r.method),
        el("td", {class: "step"}, `${r.step ?? 0} / ${r.maxSteps ?? "?"}`),
        el("td", {class: "reward"}, stropCharts.fmt(r.reward)), el("td", {}, r.baseModel),
        el("td", {}, lineageText(r.lineage)), el("td", {}, duration(r.seconds)));
    }));
    if (!runs.length) body.appendChild(el("tr", {}, el("td", {colspan: 10, class: "muted"}, "no runs match")));
  }
  every(POLL_MS, refresh);
}

// --- one run ----------------------------------------------------------------------------------------------
const CHARTS = [
  ["reward", row => Object.keys(row).filter(k => k === "reward" || k.startsWith("reward/"))],
  ["zero-variance groups (share)", () => ["zeroVarianceGroups"]],
  ["KL and sampler/trainer mismatch", () => ["klSampleTrain", "klSampleTrainMax", "samplerRatioOutside", "klBase"]],
  ["entropy", () => ["entropy"]],
  ["completion length (tokens)", () => ["completionLength"]],
  ["clipped share", () => ["clippedFraction", "ppoClippedFraction"]],
  ["step time (s)", () => ["stepSeconds", "sampleSeconds", "trainSeconds"]],
  ["learning rate", () => ["learningRate"]],
  ["loss", () => ["loss"]],
];

function drawCharts(box, runsRows) {
  const [main] = runsRows;
  const keysOf = fn => [...new Set(runsRows.flatMap(r => r.rows.flatMap(row => fn(row))))]
    .filter(k => runsRows.some(r => r.rows.some(row => typeof row[k] === "number")));
  const charts = [];
  for (const [title, fn] of CHARTS) {
    const keys = keysOf(fn);
    if (!keys.length) continue;
    const series = [];
    runsRows.forEach((r, i) => keys.forEach(k => series.push({
      name: runsRows.length > 1 ? `${r.runId} ${k}` : k, dashed: i > 0,
      points: r.rows.map(row => [row.step, typeof row[k] === "number" ? row[k] : null])})));
    charts.push(stropCharts.lineChart(title, series));
  }
  box.replaceChildren(...charts);
  if (!charts.length) box.appendChild(el("p", {class: "muted"}, `no metrics yet for ${main.runId}`));
}

function runPage(main, runId, params) {
  const others = (params.get("with") || "").split(",").filter(x => /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/.test(x));
  const head = el("div"), charts = el("div", {class: "charts", id: "charts"});
  const checkpoints = el("tbody"), log = el("pre", {id: "log"}), descriptor = el("pre", {id: "descriptor"});
  const message = el("p", {class: "error", id: "action-error"});
  const control = (what) => async (ev) => {
    // a second click within a few seconds, so a stray click does not stop a run
    const button = ev.target;
    if (!button.dataset.armed) {
      button.dataset.armed = "1"; button.textContent = `click again to ${what}`;
      setTimeout(() => { delete button.dataset.armed; button.textContent = what; }, 4000);
      return;
    }
    try { await api(`runs/${runId}/${what}`, {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"}); message.textContent = ""; }
    catch (e) { message.textContent = e.message; }
  };
  main.append(el("p", {}, el("a", {href: "#/"}, "← runs"), " · ", el("a", {href: `#/run/${runId}/rollouts`}, "rollouts")),
    head, el("div", {class: "filters"}, el("button", {class: "danger", id: "cancel", onclick: control("cancel")}, "cancel"),
      el("button", {id: "resume", onclick: control("resume")}, "resume"), message),
    el("h2", {}, others.length ? `Curves (dashed: ${others.join(", ")})` : "Curves"), charts,
    el("h2", {}, "Checkpoints"), el("table", {}, el("thead", {}, el("tr", {}, ["step", "path", "manifest sha256", "saved"]
      .map(h => el("th", {}, h)))), checkpoints),
    el("h2", {}, "Worker log (tail)"), log, el("h2", {}, "Descriptor and pinned versions"), descriptor);
  let shown = false;
  every(POLL_MS, async () => {
    const info = await api(`runs/${runId}`);
    head.replaceChildren(el("h1", {}, runId, " ", badge(info.status)), el("div", {class: "facts"},
      ...[["project", info.project], ["method", info.method], ["step", `${info.step} / ${info.steps ?? info.maxSteps ?? "?"}`],
          ["latest reward", stropCharts.fmt(info.last ? info.last.reward : null)], ["base model", info.baseModel],
          ["lineage", lineageText(info.lineage)], ["duration", duration(info.seconds)], ["error", info.error || ""]]
        .flatMap(([k, v]) => [el("span", {class: "muted"}, k), el("span", {"data-fact": k}, v)])));
    checkpoints.replaceChildren(...info.checkpoints.map(c => el("tr", {}, el("td", {}, c.step), el("td", {}, c.path),
      el("td", {}, (c.manifestSha256 || "").slice(0, 16)), el("td", {}, c.createdAt))));
    if (!shown) { descriptor.textContent = JSON.stringify({descriptor: info.descriptor, pinned: info.pinned}, null, 2); shown = true; }
    const all = [runId, ...others];
    const rows = await Promise.all(all.map(id => api(`runs/${id}/metrics`).then(m => ({runId: id, rows: m.rows}))));
    drawCharts(charts, rows);
    log.textContent = (await api(`runs/${runId}/log`)).text || "(no log yet)";
  });
}

// --- models -----------------------------------------------------------------------------------------------
async function modelsPage(main) {
  const body = el("tbody");
  main.append(el("h1", {}, "Models"), el("table", {}, el("thead", {}, el("tr", {}, ["model", "from run", "base model",
    "lineage", "adapter", "created"].map(h => el("th", {}, h)))), body));
  const {models} = await api("models");
  const which = el("input", {id: "sample-model", list: "model-ids", size: 30, value: models.length ? models[0].modelId : "",
    placeholder: "modelId or selected base model"});
  const prompt = el("textarea", {id: "sample-prompt", rows: 3, cols: 80, placeholder: "a prompt to try"});
  const tokens = el("input", {id: "sample-tokens", type: "number", min: 1, max: 512, value: 64, size: 4});
  const reply = el("pre", {id: "sample-reply"}), why = el("p", {class: "error"});
  const ask = el("button", {id: "sample-go", onclick: async () => {
    reply.textContent = "sampling (the first request loads the model)…"; why.textContent = "";
    try {
      const r = await api("sample", {method: "POST", headers: {"Content-Type": "application/json"},
        body: JSON.stringify({model: which.value.trim(), prompt: prompt.value, maxTokens: Number(tokens.value)})});
      reply.textContent = r.text;
      why.textContent = `${r.tokens} tokens, stopped by ${r.stopReason}, ${r.seconds} s`;
      why.className = "muted";
    } catch (e) { reply.textContent = ""; why.className = "error"; why.textContent = e.message; }
  }}, "sample");
  main.append(el("h2", {}, "Try a model"), el("datalist", {id: "model-ids"}, models.map(m => el("option", {value: m.modelId}))),
    el("div", {class: "filters"}, el("label", {}, "model"), which, el("label", {}, "max tokens"), tokens, ask),
    prompt, why, reply);
  body.replaceChildren(...models.map(m => el("tr", {}, el("td", {}, m.modelId),
    el("td", {}, el("a", {href: "#/run/" + m.runId}, m.runId)), el("td", {}, m.baseModel),
    el("td", {}, lineageText(m.lineage)), el("td", {}, m.adapterPath || ""), el("td", {}, m.createdAt))));
  if (!models.length) body.appendChild(el("tr", {}, el("td", {colspan: 6, class: "muted"}, "no tuned models yet")));
}

function shown(promise, main) {
  promise.catch(e => main.appendChild(el("p", {class: "error"}, e.message)));
}

// --- routing ----------------------------------------------------------------------------------------------
function route() {
  stopTimers();
  const main = document.getElementById("main");
  main.replaceChildren();
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "run" && parts[2] === "rollouts") stropRollouts.page(main, parts[1], params);
  else if (parts[0] === "run" && parts[1]) runPage(main, parts[1], params);
  else if (parts[0] === "models") shown(modelsPage(main), main);
  else if (parts[0] === "evaluations") shown(stropEvals.listPage(main), main);
  else if (parts[0] === "evaluation" && parts[1]) shown(stropEvals.onePage(main, parts[1]), main);
  else if (parts[0] === "env-eval" && parts[1]) shown(stropEvals.envEvalPage(main, parts[1]), main);
  else if (parts[0] === "compare" && parts[2]) shown(stropEvals.comparePage(main, parts[1], parts[2]), main);
  else runsPage(main, params);
}

window.stropUI = {el, api, every, badge};
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);
