// Compare page (#/compare?runs=a,b[&x=time][&all=1][&plot=KEY,...]): two to eight runs side by side.
// The curves of each standard metric overlay on one chart (one series per run), on a step or seconds axis
// aligned by stage: GET /api/compare says where each stage of each run starts on the common axis
// (trine/studio/compare.py), and each run's points come from its own /metrics, polled incrementally as on
// the run page. Below: the evals side by side and the resolved configs diffed key by key. The address
// holds the whole view (runs, axis, extra charts, all keys): copy it to share the comparison.

import { api } from "./api.js";
import { COLORS, GROUPS, MetricChart, MetricSeries } from "./chart.js";
import { renderConfigDiff, renderEvals } from "./compare_tables.js";
import { enc, errorBox, every, fill, h, notesBox, progress, setCrumbs, stateBadge } from "./util.js";

export const NAME = "compare";
export const MAX_RUNS = 8; // as GET /api/compare (trine/studio/compare_api.py)
const POLL_MS = 5000;

/** The address of a comparison: compareHref(["a", "b"], {x: "time"}) -> "#/compare?runs=a,b&x=time". */
export function compareHref(names, { x = "step", all = false, plot = [] } = {}) {
  const parts = [`runs=${names.map(enc).join(",")}`];
  if (x === "time") parts.push("x=time");
  if (all) parts.push("all=1");
  if (plot.length) parts.push(`plot=${plot.map(enc).join(",")}`);
  return `#/compare?${parts.join("&")}`;
}

const list = (text) => (text || "").split(",").map((s) => s.trim()).filter(Boolean);

export function mount(root, _params, query) {
  const names = [...new Set(list(query.get("runs")))];
  const view = { x: query.get("x") === "time" ? "time" : "step", all: query.get("all") === "1", plot: list(query.get("plot")) };
  setCrumbs(["compare"], [names.join(" · ")]);
  const head = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const notes = h("div");
  const share = h("input", { class: "share-link", readonly: true, "aria-label": "link to this comparison", value: location.href });
  const copied = h("span", { class: "muted small" });
  const axis = ["step", "time"].map((value) =>
    h(
      "label",
      { class: "field inline" },
      h("input", { type: "radio", name: "axis", value, checked: view.x === value, onchange: () => setView({ x: value }) }),
      value === "step" ? "step" : "seconds since the run's start",
    ),
  );
  const select = h("select", { "aria-label": "metric to plot" });
  const chartsGrid = h("div", { class: "charts compare-charts" });
  const evalsBox = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const configBox = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  root.append(
    head,
    h(
      "div",
      { class: "share" },
      h("span", { class: "muted" }, "Link to this comparison: "),
      share,
      h("button", { id: "copy-link", onclick: () => copyLink(share, copied) }, "Copy link"),
      copied,
    ),
    notes,
    h("h2", {}, "Curves"),
    h(
      "div",
      { class: "picker" },
      h("span", { class: "muted" }, "x axis, aligned by stage:"),
      axis,
      h("span", { class: "muted" }, " · Plot another metric: "),
      select,
      h("button", { onclick: () => select.value && !view.plot.includes(select.value) && setView({ plot: [...view.plot, select.value] }) }, "Add chart"),
    ),
    chartsGrid,
    h("h2", {}, "Evaluations"),
    evalsBox,
    h("h2", {}, "Config differences"),
    configBox,
  );

  const runs = new Map(names.map((name) => [name, { series: new MetricSeries(), next: 0, notes: new Set() }]));
  const charts = new Map();
  const state = { data: null, shown: {}, layout: "" };

  function setView(change) {
    Object.assign(view, change);
    history.replaceState(null, "", compareHref(names, view)); // no hashchange: the page stays
    share.value = location.href;
    if ("all" in change) renderTables(true);
    else redraw();
  }

  /** [xs, ys] of `key` of one run on the common axis (points of a stage the table does not know yet, or
   * without a time on the time axis, are left out). */
  function points(name, key) {
    const { series } = runs.get(name);
    const column = series.columns.get(key);
    const stages = new Map(((state.data && state.data.alignment.runs[name]) || []).map((s) => [s.stage, s]));
    const times = series.columns.get("time/unix");
    const found = [];
    for (let j = 0; column && j < column.length; j++) {
      const stage = stages.get(series.stages[j]);
      if (column[j] == null || !stage) continue;
      if (view.x === "step") found.push([stage.x_step + series.xs[j] - stage.start_step, column[j]]);
      else if (times && times[j] != null && stage.start_time != null) {
        found.push([stage.x_time + times[j] - stage.start_time, column[j]]);
      }
    }
    found.sort((a, b) => a[0] - b[0]);
    return [found.map((p) => p[0]), found.map((p) => p[1])];
  }

  /** uPlot's data for `key`: one x column shared by every run, one column per run (null where it has no point). */
  function data(key) {
    const tables = names.map((name) => points(name, key));
    const xs = [...new Set(tables.flatMap(([x]) => x))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    return [
      xs,
      ...tables.map(([x, y]) => {
        const column = new Array(xs.length).fill(null);
        x.forEach((value, i) => (column[at.get(value)] = y[i]));
        return column;
      }),
    ];
  }

  function redraw() {
    const keys = [...new Set(names.flatMap((name) => runs.get(name).series.keys()))].sort();
    const wanted = [];
    for (const [title, belongs] of GROUPS) {
      const mine = keys.filter(belongs);
      if (mine.length) wanted.push([title, mine]);
    }
    const standard = new Set(wanted.flatMap(([, mine]) => mine));
    const extra = view.plot.filter((key) => !standard.has(key));
    if (extra.length) wanted.push(["More", extra]);
    const layout = `${view.x}|${JSON.stringify(wanted)}`;
    if (layout !== state.layout) {
      state.layout = layout;
      charts.forEach((chart) => chart.destroy());
      charts.clear();
      chartsGrid.replaceChildren();
      for (const [title, mine] of wanted) {
        chartsGrid.append(h("h3", { class: "chart-group" }, title));
        for (const key of mine) {
          const remove = title === "More" ? () => setView({ plot: view.plot.filter((k) => k !== key) }) : undefined;
          charts.set(key, new MetricChart(chartsGrid, key, [key], { labels: names, axis: view.x, removable: !!remove, onRemove: remove }));
        }
      }
    }
    charts.forEach((chart, key) => chart.update(data(key)));
    const current = select.value;
    fill(select, h("option", { value: "" }, "— choose a key —"), ...keys.map((k) => h("option", { value: k }, k)));
    select.value = keys.includes(current) ? current : "";
    if (!keys.length) chartsGrid.dataset.empty = "none of these runs has logged a step yet";
    else delete chartsGrid.dataset.empty;
  }

  /** Read the run's new metrics lines; true if there were any. */
  async function pollMetrics(name) {
    const run = runs.get(name);
    let seen = 0;
    for (let round = 0; round < 25; round++) {
      const got = await api(`/runs/${enc(name)}/metrics?after=${run.next}`, { quiet: true });
      if (got.reset) run.series = new MetricSeries(); // cut back (a resumed run): read again from the start
      for (const note of got.notes || []) run.notes.add(`${name}: ${note}`);
      run.series.add(got.rows || []);
      seen += (got.rows || []).length;
      const moved = got.next !== run.next;
      run.next = got.next;
      if (!moved || !(got.rows || []).length) break;
    }
    return seen > 0;
  }

  function renderTables(force = false) {
    const { data } = state;
    const show = (box, key, value, render) => {
      const text = JSON.stringify(value);
      if (!force && state.shown[key] === text) return;
      state.shown[key] = text;
      fill(box, render());
    };
    show(head, "head", data.runs, () => renderHead(data.runs));
    show(evalsBox, "evals", data.evals, () => renderEvals(data.evals, names));
    show(configBox, "config", [data.config, view.all], () =>
      renderConfigDiff(data.config, names, view.all, (all) => setView({ all })),
    );
    const all = [...data.notes, ...data.runs.flatMap((r) => r.notes.map((n) => `${r.name}: ${n}`))];
    for (const run of runs.values()) all.push(...run.notes);
    fill(notes, notesBox([...new Set(all)], "Notes") || "");
  }

  async function poll() {
    const data = await api(`/compare?runs=${names.map(enc).join(",")}`, { quiet: true });
    let changed = !state.data || JSON.stringify(data.alignment) !== JSON.stringify(state.data.alignment);
    state.data = data;
    for (const name of names) changed = (await pollMetrics(name)) || changed;
    renderTables();
    if (changed) redraw();
  }

  const onResize = () => charts.forEach((chart) => chart.resize());
  window.addEventListener("resize", onResize);
  const stop = every(POLL_MS, () =>
    poll().catch((err) => {
      if (state.data && err.status !== 400 && err.status !== 404) return fill(notes, errorBox(err));
      stop(); // an unknown run, a bad address: nothing to poll
      fill(root, errorBox(err), h("p", {}, h("a", { href: "#/" }, "Back to the runs")));
    }),
  );
  return () => {
    stop();
    window.removeEventListener("resize", onResize);
    charts.forEach((chart) => chart.destroy());
  };
}

function renderHead(runs) {
  return [
    h("div", { class: "page-head" }, h("h1", {}, `Comparing ${runs.length} runs`)),
    h(
      "table",
      { class: "grid compact compare-runs" },
      h("thead", {}, h("tr", {}, ["", "Run", "State", "Stages", "Progress"].map((t) => h("th", {}, t)))),
      h(
        "tbody",
        {},
        runs.map((run, i) =>
          h(
            "tr",
            { dataset: { run: run.name } },
            h("td", {}, h("span", { class: "swatch", style: `background:${COLORS[i % COLORS.length]}` })),
            h("td", {}, h("a", { href: `#/run/${enc(run.name)}`, class: "run-name" }, run.name)),
            h("td", {}, stateBadge(run.state, run.why), run.why ? h("div", { class: "why" }, run.why) : null),
            h("td", {}, (run.stages || []).join(" → ") || h("span", { class: "muted" }, "–")),
            h("td", {}, progress(run.step, run.total_steps)),
          ),
        ),
      ),
    ),
  ];
}

async function copyLink(input, said) {
  try {
    await navigator.clipboard.writeText(input.value);
    said.textContent = "copied";
  } catch {
    input.select(); // no clipboard here (a page not served from localhost or https): select it to copy
    said.textContent = "selected: copy it with Ctrl-C";
  }
}
