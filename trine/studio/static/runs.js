// Runs page (#/): every run under the runs directory, refreshed every 3 s.

import { api } from "./api.js";
import { fill, ago, enc, errorBox, every, h, localTime, progress, stateBadge } from "./util.js";

export const NAME = "runs";

export function mount(root) {
  const status = h("span", { class: "muted small" });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading runs…"));
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Runs"), status), body);
  return every(3000, async () => {
    let data;
    try {
      data = await api("/runs", { quiet: true });
    } catch (err) {
      fill(body, errorBox(err));
      return;
    }
    const n = data.runs.length;
    status.textContent = `${n} run${n === 1 ? "" : "s"} in ${data.runs_dir} · refreshed ${new Date().toLocaleTimeString()}`;
    fill(body, data.runs.length ? table(data.runs) : empty(data.runs_dir));
  });
}

function empty(runsDir) {
  return h(
    "div",
    { class: "empty" },
    h("p", {}, `No runs under ${runsDir} yet.`),
    h("p", {}, "Start one from the ", h("a", { href: "#/config" }, "config editor"), " or with `trine run CONFIG run_dir=…`."),
  );
}

function table(runs) {
  const sorted = [...runs].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  return h(
    "table",
    { class: "grid runs-table" },
    h("thead", {}, h("tr", {}, ["Run", "State", "Stages", "Progress", "Updated"].map((t) => h("th", {}, t)))),
    h("tbody", {}, sorted.map(row)),
  );
}

function row(run) {
  const href = `#/run/${enc(run.name)}`;
  const why = run.why && run.state !== "finished" && run.state !== "running" ? h("div", { class: "why" }, run.why) : null;
  const notes = run.notes && run.notes.length
    ? h("span", { class: "note-flag", title: run.notes.join("\n") }, `⚠ ${run.notes.length}`)
    : null;
  return h(
    "tr",
    { dataset: { run: run.name } },
    h("td", {}, h("a", { href, class: "run-name" }, run.name), " ", notes),
    h("td", {}, stateBadge(run.state, run.why), why),
    h("td", {}, (run.stages || []).join(" → ") || h("span", { class: "muted" }, run.mode || "–")),
    h("td", {}, progress(run.step, run.total_steps)),
    h("td", { title: localTime(run.updated) }, ago(run.updated)),
  );
}
