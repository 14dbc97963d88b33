// Curves of metrics.jsonl with the vendored uPlot (a global from vendor/uPlot.iife.min.js).
// MetricSeries keeps the columns (x = step) as rows arrive; MetricChart draws some keys of it and exposes
// how many points it holds as data-points / data-values on its element (for people and for tests).

import { fmt, h } from "./util.js";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

/** Whole steps only on the x axis. */
const STEP_INCREMENTS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

/** The y range: uPlot's padded range, or a small one around a flat line (uPlot's own is 0..100). */
function yRange(u, min, max) {
  if (min === null || max === null) return [0, 1];
  if (min === max) {
    if (min === 0) return [0, 1];
    const pad = Math.abs(min) * 0.1;
    return [min - pad, max + pad];
  }
  return uPlot.rangeNum(min, max, 0.1, true);
}

/** The numeric columns of metrics rows, by step. Rows of one step are merged into one point. */
export class MetricSeries {
  constructor() {
    this.xs = [];
    this.columns = new Map();
    this.offset = 0;
    this.lastStage = null;
  }

  /** Add rows (objects with "step"); returns the keys seen for the first time. */
  add(rows) {
    const fresh = [];
    for (const row of rows) {
      if (typeof row.step !== "number") continue;
      const x = this.position(row);
      let index = this.xs.length - 1;
      if (index < 0 || this.xs[index] !== x) {
        this.xs.push(x);
        for (const column of this.columns.values()) column.push(null);
        index += 1;
      }
      for (const [key, value] of Object.entries(row)) {
        if (key === "step" || typeof value !== "number" || !Number.isFinite(value)) continue;
        if (!this.columns.has(key)) {
          this.columns.set(key, new Array(this.xs.length).fill(null));
          fresh.push(key);
        }
        this.columns.get(key)[index] = value;
      }
    }
    return fresh;
  }

  /** Where a row goes on the x axis: its step; a stage that counts from 0 again is shifted after the
   * previous one; a resumed run that logs a step again replaces the points from there on. */
  position(row) {
    const stage = row.stage ?? null;
    let x = row.step + this.offset;
    const last = this.xs.length ? this.xs[this.xs.length - 1] : null;
    if (last !== null && x < last) {
      if (stage !== this.lastStage) {
        this.offset += last - x + 1;
        x = row.step + this.offset;
      } else {
        const keep = this.xs.findIndex((value) => value >= x);
        this.xs.length = keep;
        for (const column of this.columns.values()) column.length = keep;
      }
    }
    this.lastStage = stage;
    return x;
  }

  keys() {
    return [...this.columns.keys()].filter((key) => key !== "time/unix").sort();
  }

  /** uPlot's data for `keys`: [xs, column, column...] (copies, so later adds do not leak in). */
  data(keys) {
    return [this.xs.slice(), ...keys.map((key) => (this.columns.get(key) || []).slice())];
  }
}

/** One uPlot chart of `keys` inside a titled panel. */
export class MetricChart {
  constructor(parent, title, keys, { removable = false, onRemove } = {}) {
    this.keys = keys;
    this.canvasBox = h("div", { class: "chart-canvas" });
    const remove = removable ? h("button", { class: "link", title: "remove this chart", onclick: onRemove }, "✕") : null;
    this.el = h(
      "section",
      { class: "chart", dataset: { title, keys: keys.join(","), points: "0", values: "0" } },
      h("div", { class: "chart-title" }, h("span", {}, title), remove),
      this.canvasBox,
    );
    parent.append(this.el);
    this.plot = null;
  }

  options(width) {
    return {
      width,
      height: 200,
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false }, y: { range: yRange } },
      series: [
        { label: "step", value: (u, v) => (v == null ? "–" : String(v)) },
        ...this.keys.map((key, i) => ({
          label: shortLabel(key, this.keys),
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          spanGaps: true,
          value: (u, v) => fmt(v),
          points: { size: 5 },
        })),
      ],
      axes: [
        { grid: { stroke: "#eee" }, incrs: STEP_INCREMENTS },
        { size: 56, grid: { stroke: "#eee" }, values: (u, values) => values.map((v) => fmt(v)) },
      ],
    };
  }

  /** Draw `data` (uPlot's column format); creates the plot the first time. */
  update(data) {
    const width = Math.max(240, this.canvasBox.clientWidth || 400);
    if (!this.plot) this.plot = new uPlot(this.options(width), data, this.canvasBox);
    else this.plot.setData(data);
    const values = data.slice(1).reduce((n, column) => n + column.filter((v) => v !== null).length, 0);
    this.el.dataset.points = String(data[0].length);
    this.el.dataset.values = String(values);
  }

  resize() {
    if (this.plot) this.plot.setSize({ width: Math.max(240, this.canvasBox.clientWidth), height: 200 });
  }

  destroy() {
    if (this.plot) this.plot.destroy();
    this.el.remove();
  }
}

/** A key without the part every key of the chart shares ("eval/addition/accuracy" -> "addition/accuracy"). */
function shortLabel(key, keys) {
  if (keys.length < 2) return key;
  const first = key.split("/")[0];
  return keys.every((k) => k.split("/")[0] === first) ? key.slice(first.length + 1) : key;
}
