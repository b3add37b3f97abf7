// Evaluations: the list, one evaluation's per-item answers, and two evaluations side by side with the judge's
// verdicts. Questions, responses and judge reasoning are untrusted text: text nodes only.
"use strict";

function judgeText(judge) {
  if (!judge) return "";
  if (judge.error) return "judge error: " + judge.error;
  const scores = judge.scores ? Object.entries(judge.scores).map(([k, v]) => `${k} ${v}`).join(" · ") : "";
  return scores + (judge.reasoning ? "\n" + judge.reasoning : "");
}

async function listPage(main) {
  const {el, api, badge} = window.stropUI;
  const fmt = window.stropCharts.fmt;
  const body = el("tbody"), note = el("p", {class: "error"});
  const compare = el("button", {id: "compare-evals", onclick: () => {
    // newest first in the table: the older one is A, the baseline
    const ids = [...document.querySelectorAll("input.pick-eval:checked")].map(c => c.value).reverse();
    if (ids.length === 2) location.hash = `#/compare/${ids[0]}/${ids[1]}`;
    else note.textContent = "pick exactly two evaluations to compare";
  }}, "compare the two selected");
  main.append(el("h1", {}, "Evaluations"), el("div", {class: "filters"}, compare, note),
    el("table", {id: "evaluations"}, el("thead", {}, el("tr", {}, ["", "evaluation", "model", "dataset", "grader",
      "status", "mean score", "accuracy", "run", "created"].map(h => el("th", {}, h)))), body));
  const {evaluations} = await api("evaluations");
  body.replaceChildren(...evaluations.map(e => el("tr", {class: "click", "data-eval": e.evaluationId,
      onclick: () => { location.hash = "#/evaluation/" + e.evaluationId; }},
    el("td", {}, el("input", {type: "checkbox", class: "pick-eval", value: e.evaluationId, onclick: ev => ev.stopPropagation()})),
    el("td", {}, e.evaluationId), el("td", {}, e.model), el("td", {}, JSON.stringify(e.dataset ?? "")),
    el("td", {}, e.grader), el("td", {}, badge(e.status)), el("td", {}, fmt(e.summary.meanScore ?? e.summary.mean)),
    el("td", {}, fmt(e.summary.accuracy)), el("td", {}, e.runId ? el("a", {href: "#/run/" + e.runId}, e.runId) : ""),
    el("td", {}, e.createdAt))));
  if (!evaluations.length) body.appendChild(el("tr", {}, el("td", {colspan: 10, class: "muted"}, "no evaluations yet")));
  const {envEvals} = await api("env-evals");
  const passes = r => Object.entries(r.splits || {}).map(([k, s]) => `${k} ${fmt(s["pass@1"])}`).join(" · ");
  main.append(el("h2", {}, "Environment evaluations (strop envs eval)"),
    el("table", {id: "env-evals"}, el("thead", {}, el("tr", {}, ["report", "environment", "model", "baseline",
      "pass@1 per split", "created"].map(h => el("th", {}, h)))), el("tbody", {}, envEvals.length ? envEvals.map(r =>
      el("tr", {class: "click", "data-env-eval": r.envEvalId, onclick: () => { location.hash = "#/env-eval/" + r.envEvalId; }},
        el("td", {}, r.envEvalId), el("td", {}, r.env ?? ""), el("td", {}, r.model ?? ""),
        el("td", {}, r.baseline ? r.baseline.model ?? "" : ""), el("td", {}, passes(r)), el("td", {}, r.createdAt ?? "")))
      : el("tr", {}, el("td", {colspan: 6, class: "muted"}, "no environment evaluations yet")))));
}

// One `strop envs eval` report: pass@1 and the behaviour rubrics per split as charts (the baseline beside the
// model when one was evaluated), the numbers in a table, the headroom and the exact McNemar per split.
async function envEvalPage(main, id) {
  const {el, api} = window.stropUI;
  const {fmt, barChart} = window.stropCharts;
  const r = await api("env-evals/" + id);
  const splits = Object.keys(r.splits || {});
  const who = [[r.model, r.splits], ...(r.baseline ? [[r.baseline.model, r.baseline.splits]] : [])];
  const series = pick => who.map(([name, s]) => ({name: String(name), values: splits.map(k => s[k] ? pick(s[k]) : null)}));
  main.append(el("p", {}, el("a", {href: "#/evaluations"}, "← evaluations")),
    el("h1", {}, `${r.env}: ${r.model}`), el("p", {class: "muted"}, `${id} · ${r.createdAt ?? ""}`),
    el("div", {class: "charts", id: "env-charts"}, barChart("pass@1 per split", splits, series(s => s["pass@1"]), "pass"),
      ...splits.map(k => {
        const names = Object.keys(r.splits[k].rubrics || {});
        return barChart(`rubrics: ${k}`, names, who.map(([name, s]) => ({name: String(name),
          values: names.map(n => s[k] && s[k].rubrics ? s[k].rubrics[n] ?? null : null)})), "rubrics-" + k);
      })),
    el("h2", {}, "Per split"), el("table", {id: "env-splits"}, el("thead", {}, el("tr", {}, ["model", "split", "tasks",
      "pass@1", "mean reward", "rubrics"].map(h => el("th", {}, h)))), el("tbody", {}, who.flatMap(([name, s]) =>
      Object.entries(s).map(([k, v]) => el("tr", {}, el("td", {}, name), el("td", {}, k), el("td", {}, v.n ?? ""),
        el("td", {}, fmt(v["pass@1"])), el("td", {}, fmt(v.meanReward)),
        el("td", {}, Object.entries(v.rubrics || {}).map(([n, x]) => `${n} ${fmt(x)}`).join(" · "))))))),
    el("div", {}, r.comparison ? el("div", {}, el("h2", {}, "Model vs baseline"), el("table", {id: "env-comparison"},
      el("thead", {}, el("tr", {}, ["split", "baseline", "model", "delta", "McNemar exact p", "only baseline",
        "only model"].map(h => el("th", {}, h)))), el("tbody", {}, Object.entries(r.comparison).map(([k, c]) =>
        el("tr", {}, [k, fmt(c.baseline), fmt(c.model), fmt(c.delta), fmt(c.mcnemarP), c.baselineOnly, c.modelOnly]
          .map(v => el("td", {}, v))))))) : null,
    r.headroom ? el("div", {}, el("h2", {}, "Headroom"), el("pre", {id: "env-headroom"}, JSON.stringify(r.headroom, null, 2))) : null));
}

async function onePage(main, id) {
  const {el, api, badge} = window.stropUI;
  const fmt = window.stropCharts.fmt;
  const r = await api("evaluations/" + id);
  main.append(el("p", {}, el("a", {href: "#/evaluations"}, "← evaluations")), el("h1", {}, id, " ", badge(r.status)),
    el("pre", {id: "eval-summary"}, JSON.stringify({model: r.model, dataset: r.dataset, grader: r.grader, summary: r.summary}, null, 2)),
    el("h2", {}, `Items (${r.itemsShown})`),
    el("table", {id: "items"}, el("thead", {}, el("tr", {}, ["#", "question", "gold", "answer", "score", "response",
      "judge"].map(h => el("th", {}, h)))), el("tbody", {}, r.items.map(i => el("tr", {},
      el("td", {}, i.index), el("td", {}, el("pre", {}, i.question)), el("td", {}, i.gold ?? ""),
      el("td", {}, i.extracted ?? "–"), el("td", {}, fmt(i.score)), el("td", {}, el("pre", {class: "response"}, i.response ?? "")),
      el("td", {}, el("pre", {}, judgeText(i.judge))))))));
}

// The static dashboard's panels (strop.report.panels computes them for both) as interactive charts, and its
// summary table. Labels come from model names and evaluation ids: set as text.
function dashboard(d) {
  const {el} = window.stropUI;
  const {barChart, heatmap} = window.stropCharts;
  const charts = d.panels.map(p => p.kind === "heatmap" ? heatmap(p.title, p.levels, p.counts, d.labels[0], d.labels[1], p.id)
    : p.kind === "pairs" ? barChart(p.title, p.items.map(i => "#" + i), p.series, p.id)
    : barChart(p.title, p.categories, p.series, p.id));
  return el("div", {id: "dashboard"}, el("div", {class: "charts"}, ...charts),
    el("table", {id: "dashboard-summary"}, el("thead", {}, el("tr", {}, ["statistic", d.labels[0], d.labels[1],
      "B − A"].map(h => el("th", {}, h)))), el("tbody", {}, d.summary.map(row => el("tr", {}, row.map(v => el("td", {}, v)))))));
}

async function comparePage(main, a, b) {
  const {el, api} = window.stropUI;
  const fmt = window.stropCharts.fmt;
  const c = await api(`compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
  const side = s => el("td", {class: s.correct ? "" : "error"}, el("div", {}, `answer ${s.answer ?? "–"}`,
    s.correct ? " ✓" : " ✗"), el("pre", {}, s.response ?? ""), s.judge ? el("pre", {}, judgeText({scores: s.judge})) : null);
  main.append(el("p", {}, el("a", {href: "#/evaluations"}, "← evaluations")),
    el("h1", {}, `${c.a.label} vs ${c.b.label}`),
    el("div", {class: "facts", id: "compare-stats"}, ...[["items", c.n], ["accuracy A", fmt(c.accuracy.a)],
      ["accuracy B", fmt(c.accuracy.b)], ["B − A", `${fmt(c.accuracy.delta)} (95% CI ${fmt(c.accuracy.ci95[0])} … ${fmt(c.accuracy.ci95[1])})`],
      ["McNemar exact p", `${fmt(c.mcnemar.p)} (A only ${c.mcnemar.aOnly}, B only ${c.mcnemar.bOnly})`]]
      .flatMap(([k, v]) => [el("span", {class: "muted"}, k), el("span", {}, v)])),
    el("h2", {}, "Dashboard"), dashboard(c.dashboard),
    el("h2", {}, "Per item"), el("table", {id: "compare-items"}, el("thead", {}, el("tr", {}, ["#", "question", "gold",
      c.a.label, c.b.label].map(h => el("th", {}, h)))), el("tbody", {}, c.items.map(i => el("tr", {},
      el("td", {}, i.index), el("td", {}, el("pre", {}, i.question)), el("td", {}, i.gold ?? ""), side(i.a), side(i.b))))));
}

window.stropEvals = {listPage, onePage, comparePage, envEvalPage};
