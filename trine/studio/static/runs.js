// Runs page (#/): every run under the runs directory, refreshed every 3 s. Tick two or more runs and
// "Compare" opens #/compare?runs=a,b (the runs in the order they were ticked).

import { api } from "./api.js";
import { compareHref, MAX_RUNS } from "./compare.js";
import { fill, ago, enc, errorBox, every, h, localTime, progress, stateBadge } from "./util.js";

export const NAME = "runs";

export function mount(root) {
  const status = h("span", { class: "muted small" });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading runs…"));
  const picked = new Set(); // kept across refreshes, in the order ticked
  const compare = h("button", { id: "compare", class: "primary", onclick: () => (location.hash = compareHref([...picked])) });
  const showPicked = () => {
    const n = picked.size;
    compare.textContent = n >= 2 ? `Compare ${n} runs` : "Compare";
    compare.disabled = n < 2 || n > MAX_RUNS;
    compare.title = n < 2 ? "tick two or more runs to compare them" : n > MAX_RUNS ? `at most ${MAX_RUNS} runs` : "";
  };
  const toggle = (name, on) => {
    if (on) picked.add(name);
    else picked.delete(name);
    showPicked();
  };
  showPicked();
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Runs"), compare, status), body);
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
    const names = new Set(data.runs.map((r) => r.name));
    for (const name of [...picked]) if (!names.has(name)) picked.delete(name); // a run that went away
    showPicked();
    fill(body, data.runs.length ? table(data.runs, picked, toggle) : empty(data.runs_dir));
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

function table(runs, picked, toggle) {
  const sorted = [...runs].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  return h(
    "table",
    { class: "grid runs-table" },
    h("thead", {}, h("tr", {}, ["", "Run", "State", "Stages", "Progress", "Updated"].map((t) => h("th", {}, t)))),
    h("tbody", {}, sorted.map((run) => row(run, picked, toggle))),
  );
}

function row(run, picked, toggle) {
  const href = `#/run/${enc(run.name)}`;
  const why = run.why && run.state !== "finished" && run.state !== "running" ? h("div", { class: "why" }, run.why) : null;
  const notes = run.notes && run.notes.length
    ? h("span", { class: "note-flag", title: run.notes.join("\n") }, `⚠ ${run.notes.length}`)
    : null;
  const tick = h("input", {
    type: "checkbox",
    class: "pick",
    "aria-label": `compare ${run.name}`,
    checked: picked.has(run.name),
    onchange: (event) => toggle(run.name, event.target.checked),
  });
  return h(
    "tr",
    { dataset: { run: run.name } },
    h("td", { class: "pick-cell" }, tick),
    h("td", {}, h("a", { href, class: "run-name" }, run.name), " ", notes),
    h("td", {}, stateBadge(run.state, run.why), why),
    h("td", {}, (run.stages || []).join(" → ") || h("span", { class: "muted" }, run.mode || "–")),
    h("td", {}, progress(run.step, run.total_steps)),
    h("td", { title: localTime(run.updated) }, ago(run.updated)),
  );
}
