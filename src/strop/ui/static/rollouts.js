// The rollout browser: one step's groups, each group's samples side by side; multi-turn episodes as
// conversations. Model text, tool results and grader messages are untrusted: they become text nodes only.
"use strict";
const TOOL_CALL = /<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g;

function messageBody(role, content) {
  const {el} = window.stropUI;
  const text = typeof content === "string" ? content : JSON.stringify(content, null, 1);
  if (role !== "assistant") return [el("pre", {}, text)];
  const parts = [];
  let last = 0;
  for (const m of text.matchAll(TOOL_CALL)) {
    if (m.index > last) parts.push(el("pre", {}, text.slice(last, m.index)));
    parts.push(el("div", {class: "toolcall"}, el("span", {class: "role"}, "tool call"), el("pre", {}, m[1].trim())));
    last = m.index + m[0].length;
  }
  if (last < text.length) parts.push(el("pre", {}, text.slice(last)));
  return parts;
}

function conversation(transcript) {
  const {el} = window.stropUI;
  return el("div", {class: "conversation"}, transcript.map(m => {
    const role = String(m.role || "?");
    return el("div", {class: "msg " + role}, el("div", {class: "role"}, role === "tool" ? "tool result" : role),
      messageBody(role, m.content ?? ""));
  }));
}

function sampleCard(row) {
  const {el} = window.stropUI;
  const fmt = window.stropCharts.fmt;
  const scores = row.scores && typeof row.scores === "object" ? Object.entries(row.scores) : [];
  const errors = Array.isArray(row.errors) ? row.errors : [];
  return el("div", {class: "sample", "data-line": row.line},
    el("div", {}, el("b", {}, `reward ${fmt(row.reward)}`), ` · advantage ${fmt(row.advantage)}`,
      row.turns !== undefined ? ` · ${row.turns} turns` : "", row.tokens !== undefined ? ` · ${row.tokens} tokens` : "",
      row.stop_reason ? ` · ${row.stop_reason}` : ""),
    scores.length ? el("div", {class: "scores"}, scores.map(([k, v]) => `${k} ${fmt(v)}`).join(" · ")) : null,
    errors.length ? el("div", {class: "errors"}, errors.map(e => el("div", {}, "grader error: " + String(e)))) : null,
    row.tooLarge ? el("p", {class: "error"}, row.tooLarge) : null,
    row.unreadable ? el("p", {class: "error"}, row.unreadable) : null,
    Array.isArray(row.transcript) ? conversation(row.transcript)
      : el("pre", {class: "completion"}, row.completion ?? row.head ?? ""));
}

function groupsOf(rows) {
  const groups = new Map();
  for (const r of rows) {
    const key = `${r.step}/${r.group}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(r);
  }
  return groups;
}

function groupBox(key, rows) {
  const {el} = window.stropUI;
  const first = rows[0];
  const prompt = first.prompt ?? first.question ?? "";
  return el("div", {class: "group", "data-group": key},
    el("div", {}, el("b", {}, `step ${first.step} · group ${first.group}`), first.task ? ` · task ${first.task}` : "",
      first.gold !== undefined && first.gold !== null ? ` · gold ${first.gold}` : ""),
    el("details", {open: !Array.isArray(first.transcript)}, el("summary", {}, "prompt"), el("pre", {class: "prompt"}, String(prompt))),
    el("div", {class: "samples"}, rows.map(sampleCard)));
}

function page(main, runId, params) {
  const {el, api} = window.stropUI;
  const input = (id, attrs) => el("input", {id, value: params.get(id) || "", ...attrs});
  const step = el("select", {id: "step"}), fields = {
    group: input("group", {size: 3}), minReward: input("minReward", {size: 5}), maxReward: input("maxReward", {size: 5}),
    term: input("term", {size: 10}), termMin: input("termMin", {size: 5}), kind: input("kind", {size: 10}),
    q: input("q", {size: 16, placeholder: "search text"})};
  const errors = el("input", {type: "checkbox", id: "errors"});
  const list = el("div", {id: "rollouts"}), info = el("span", {class: "muted"}), note = el("p", {class: "error"});
  let offset = 0, next = null;
  const go = el("button", {id: "apply", onclick: () => { offset = 0; load(); }}, "apply");
  const more = el("button", {id: "next", onclick: () => { if (next !== null) { offset = next; load(); } }}, "next page");
  const back = el("button", {onclick: () => { offset = Math.max(0, offset - 40); load(); }}, "previous page");
  main.append(el("p", {}, el("a", {href: "#/run/" + runId}, "← " + runId)), el("h1", {}, "Rollouts"),
    el("div", {class: "filters"}, el("label", {}, "step"), step, ...Object.entries(fields).flatMap(([k, f]) =>
      [el("label", {for: k}, k), f]), el("label", {}, "errors only"), errors, go), note,
    el("div", {class: "pager"}, back, more, info), list);
  async function load() {
    const q = new URLSearchParams({offset, limit: 40});
    if (step.value !== "") q.set("step", step.value);
    for (const [k, f] of Object.entries(fields)) if (f.value.trim()) q.set(k, f.value.trim());
    if (errors.checked) q.set("errors", "1");
    try {
      const t0 = performance.now();
      const p = await api(`runs/${runId}/rollouts?${q}`);
      next = p.next ?? (p.complete && p.matched !== null && offset + p.rows.length < p.matched ? offset + p.rows.length : null);
      info.textContent = (p.matched !== null ? `${p.rows.length} of ${p.matched} matching` : `${p.rows.length} found, read to ${p.scannedTo} of ${p.candidates}`)
        + ` · ${p.total} rollouts in the run · ${Math.round(performance.now() - t0)} ms`;
      const groups = groupsOf(p.rows);
      list.replaceChildren(...[...groups].map(([k, rows]) => groupBox(k, rows)));
      if (!p.rows.length) list.appendChild(el("p", {class: "muted"}, "no rollouts match"));
      note.textContent = "";
    } catch (e) { note.textContent = e.message; }
  }
  api(`runs/${runId}/steps`).then(s => {
    step.append(el("option", {value: ""}, "all"), ...s.steps.map(x => el("option", {value: x.step},
      `${x.step} (${x.rollouts})`)));
    const wanted = params.get("step");
    step.value = wanted !== null ? wanted : (s.steps.length ? String(s.steps[0].step) : "");
    step.onchange = () => { offset = 0; load(); };
    load();
  }).catch(e => { note.textContent = e.message; });
}

window.stropRollouts = {page};
