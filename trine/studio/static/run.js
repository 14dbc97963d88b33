// Run page (#/run/NAME): state, progress, processes, buffer, alarms, notes; live curves polled incrementally from
// /metrics?after=OFFSET every 3 s; a picker to plot any numeric key; the resolved config; the eval table.

import { api, showError } from "./api.js";
import { GROUPS, MetricChart, MetricSeries } from "./chart.js";
import { fill, enc, errorBox, every, fmt, h, notesBox, progress, setCrumbs, stateBadge } from "./util.js";

export const NAME = "run";

export function mount(root, { name }) {
  setCrumbs([name]);
  const base = `/runs/${enc(name)}`;
  const header = h("div", { class: "run-header" }, h("p", { class: "muted" }, "Loading…"));
  const notes = h("div");
  const chartsGrid = h("div", { class: "charts" });
  const picker = h("div", { class: "picker" });
  const evals = h("div", {});
  const configBox = h("div", {});
  root.append(
    header,
    notes,
    h("h2", {}, "Curves"),
    picker,
    chartsGrid,
    h("h2", {}, "Evaluations"),
    evals,
    h("h2", {}, "Resolved config"),
    configBox,
  );

  const series = new MetricSeries();
  const slots = new Map(GROUPS.map(([title]) => [title, h("div", { class: "slot" })]));
  chartsGrid.append(...slots.values());
  const customGrid = h("div", { class: "slot-custom" });
  chartsGrid.append(customGrid);
  const charts = new Map();
  const state = { next: 0, runNotes: [], metricNotes: new Set(), configShown: null };
  const select = h("select", { "aria-label": "metric to plot" });
  picker.append(
    h("span", { class: "muted" }, "Plot another metric: "),
    select,
    h("button", { onclick: () => addCustom(select.value) }, "Add chart"),
  );

  function addCustom(key) {
    if (!key || charts.has(`custom:${key}`)) return;
    const chart = new MetricChart(customGrid, key, [key], {
      removable: true,
      onRemove: () => {
        chart.destroy();
        charts.delete(`custom:${key}`);
      },
    });
    charts.set(`custom:${key}`, chart);
    chart.update(series.data([key]));
  }

  function redraw() {
    const keys = series.keys();
    for (const [title, belongs] of GROUPS) {
      const wanted = keys.filter(belongs);
      let chart = charts.get(title);
      if (chart && chart.keys.join() !== wanted.join()) {
        chart.destroy();
        chart = null;
      }
      if (!chart && wanted.length) {
        chart = new MetricChart(slots.get(title), title, wanted);
        charts.set(title, chart);
      }
      if (chart) chart.update(series.data(wanted));
      else charts.delete(title);
    }
    for (const [id, chart] of charts) if (id.startsWith("custom:")) chart.update(series.data(chart.keys));
    const missing = GROUPS.filter(([title]) => !charts.has(title)).map(([title]) => title.toLowerCase());
    chartsGrid.dataset.missing = missing.join(",");
    const current = select.value;
    fill(select, h("option", { value: "" }, "— choose a key —"), ...keys.map((k) => h("option", { value: k }, k)));
    select.value = keys.includes(current) ? current : "";
    if (!series.xs.length) chartsGrid.dataset.empty = "metrics.jsonl has no rows yet";
    else delete chartsGrid.dataset.empty;
  }

  async function pollMetrics() {
    let fresh = [];
    let rowsSeen = 0;
    for (let round = 0; round < 25; round++) {
      const data = await api(`${base}/metrics?after=${state.next}`, { quiet: true });
      for (const note of data.notes || []) state.metricNotes.add(note);
      fresh = fresh.concat(series.add(data.rows || []));
      rowsSeen += (data.rows || []).length;
      const moved = data.next !== state.next;
      state.next = data.next;
      if (!moved || !(data.rows || []).length) break;
    }
    if (rowsSeen || !charts.size) redraw();
    renderNotes();
    if (fresh.some((k) => k.startsWith("eval/")) || (rowsSeen && series.keys().some((k) => k.startsWith("eval/")))) {
      await loadEvals();
    }
  }

  async function pollRun() {
    const run = await api(base, { quiet: true });
    state.runNotes = run.notes || [];
    fill(header, ...renderHeader(run).filter(Boolean));
    if (run.config_yaml !== state.configShown) {
      state.configShown = run.config_yaml;
      fill(configBox, renderConfig(run));
    }
    renderNotes();
  }

  function renderNotes() {
    const all = [...state.runNotes, ...state.metricNotes];
    fill(notes, notesBox(all, "This run has notes") || "");
  }

  async function loadEvals() {
    try {
      fill(evals, renderEvals(await api(`${base}/evals`, { quiet: true })));
    } catch (err) {
      fill(evals, errorBox(err));
    }
  }

  const onResize = () => charts.forEach((chart) => chart.resize());
  window.addEventListener("resize", onResize);
  loadEvals();
  const stop = () => {
    stopRun();
    stopMetrics();
  };
  const stopRun = every(3000, () =>
    pollRun().catch((err) => {
      if (err.status === 404 || err.status === 400) {
        stop(); // no such run: nothing to poll
        fill(root, errorBox(err), h("p", {}, h("a", { href: "#/" }, "Back to the runs")));
      } else fill(header, errorBox(err));
    }),
  );
  const stopMetrics = every(3000, () => pollMetrics().catch((err) => err.status !== 404 && showError(err)));
  return () => {
    stop();
    window.removeEventListener("resize", onResize);
    charts.forEach((chart) => chart.destroy());
  };
}

function renderHeader(run) {
  const href = `#/run/${enc(run.name)}`;
  const stages = (run.stages || []).map((s) =>
    h("span", { class: "chip" }, `${s.name}`, h("span", { class: "muted" }, ` ${s.mode || ""} ${s.total_steps ?? "?"} steps`)),
  );
  const counts = run.buffer && run.buffer.counts ? Object.entries(run.buffer.counts) : [];
  return [
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, run.name),
      stateBadge(run.state, run.why),
      h("span", { class: "why" }, run.why || ""),
    ),
    h(
      "div",
      { class: "facts" },
      fact("Progress", progress(run.step, run.total_steps)),
      fact("Stages", stages.length ? stages : "–"),
      fact(
        "Buffer",
        run.buffer
          ? [h("span", { class: "muted" }, `${run.buffer.storage} `), counts.map(([k, n]) => h("span", { class: "chip" }, `${k} ${n}`))]
          : h("span", { class: "muted" }, "none"),
      ),
      fact("Open", [
        h("a", { href: `${href}/experiences` }, "Experiences"),
        " · ",
        h("a", { href: `${href}/annotate` }, run.annotations ? "Annotations" : "Annotations (none yet)"),
        run.config_yaml ? [" · ", h("a", { href: `#/config?template=${enc(`run:${run.name}`)}` }, "Edit a copy of the config")] : null,
      ]),
    ),
    run.processes && run.processes.length ? processTable(run.processes) : null,
    alarmsBox(run.alarms),
  ];
}

/** The alarms the run raised (reward hacking?, truncation, length), with their numbers; null if none. */
function alarmsBox(alarms) {
  if (!alarms || alarms.length === 0) return null;
  const item = (a) => h("li", {}, h("strong", {}, `${a.kind} at step ${a.step}: `), a.message || "");
  return h("div", { class: "notes alarms", role: "alert" }, h("strong", {}, "Alarms"), h("ul", {}, alarms.map(item)));
}

function fact(label, value) {
  return h("div", { class: "fact" }, h("div", { class: "fact-label" }, label), h("div", { class: "fact-value" }, value));
}

function processTable(processes) {
  const columns = ["name", "state", "why", "step", "version", "lag", "pid", "host", "heartbeat"];
  return h(
    "table",
    { class: "grid compact processes" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      processes.map((p) =>
        h("tr", {}, columns.map((c) => h("td", {}, c === "state" ? stateBadge(p.state, p.why) : fmt(p[c])))),
      ),
    ),
  );
}

function renderConfig(run) {
  if (!run.config_yaml) return h("p", { class: "muted" }, "No config.yaml in this run directory (yet).");
  return h(
    "details",
    { class: "config" },
    h("summary", {}, `config.yaml (${run.config_yaml.split("\n").length} lines)`),
    h("pre", { class: "code" }, run.config_yaml),
  );
}

function renderEvals(data) {
  if (!data.rows || !data.rows.length) return h("p", { class: "muted" }, "No evaluations logged yet.");
  const columns = data.columns || [];
  return h(
    "table",
    { class: "grid compact evals" },
    h("thead", {}, h("tr", {}, ["step", "taskset", ...columns].map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      data.rows.map((row) =>
        h("tr", {}, h("td", {}, fmt(row.step)), h("td", {}, row.taskset), columns.map((c) => h("td", { class: "num" }, fmt(row[c])))),
      ),
    ),
  );
}
