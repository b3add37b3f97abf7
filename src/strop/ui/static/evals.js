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

window.stropEvals = {listPage, onePage, comparePage};
