// Curves of metrics.jsonl with the vendored uPlot (a global from vendor/uPlot.iife.min.js).
// MetricSeries keeps the columns (x = step) as rows arrive; MetricChart draws some keys of it (or one key of
// several runs: the compare page) and exposes how many points it holds as data-points / data-values /
// data-series on its element (for people and for tests). GROUPS are the standard charts of both pages.

import { fmt, fmtSeconds, h } from "./util.js";

/** The standard charts: title and which metric keys belong to it (the keys that exist are drawn). */
export const GROUPS = [
  ["Reward", (k) => /(^|\/)reward_mean$/.test(k)],
  ["Eval accuracy", (k) => /^eval\/.*(accuracy|avg@\d+|pass@\d+)$/.test(k)],
  ["Loss", (k) => /^trainer\/(loss|pg_loss|dpo_loss|sft_loss)$/.test(k)],
  ["Response length", (k) => /response_length_(mean|max)$/.test(k)],
  ["Staleness", (k) => /^buffer\/staleness_/.test(k)],
  ["Throughput (tokens/s)", (k) => /tokens_per_second$/.test(k)],
];

export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

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

/** The numeric columns of metrics rows, by step. Rows of one step are merged into one point; `stages`
 * holds the stage of each point (its first row's `stage`, "" for none). */
export class MetricSeries {
  constructor() {
    this.xs = [];
    this.stages = [];
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
        this.stages.push(typeof row.stage === "string" ? row.stage : "");
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
        this.stages.length = keep;
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

/** One uPlot chart of `keys` inside a titled panel: one series per key, or per label in `labels` (the
 * compare page draws one key of several runs). `axis` "step" (whole steps) or "time" (seconds). */
export class MetricChart {
  constructor(parent, title, keys, { removable = false, onRemove, labels, axis = "step" } = {}) {
    this.keys = keys;
    this.labels = labels || keys.map((key) => shortLabel(key, keys));
    this.axis = axis;
    this.canvasBox = h("div", { class: "chart-canvas" });
    const remove = removable ? h("button", { class: "link", title: "remove this chart", onclick: onRemove }, "✕") : null;
    this.el = h(
      "section",
      { class: "chart", dataset: { title, keys: keys.join(","), axis, points: "0", values: "0", series: "0" } },
      h("div", { class: "chart-title" }, h("span", {}, title), remove),
      this.canvasBox,
    );
    parent.append(this.el);
    this.plot = null;
  }

  options(width) {
    const time = this.axis === "time";
    return {
      width,
      height: 200,
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false }, y: { range: yRange } },
      series: [
        { label: time ? "seconds" : "step", value: (u, v) => (v == null ? "–" : time ? fmtSeconds(v) : String(v)) },
        ...this.labels.map((label, i) => ({
          label,
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          spanGaps: true,
          value: (u, v) => fmt(v),
          points: { size: 5 },
        })),
      ],
      axes: [
        time
          ? { grid: { stroke: "#eee" }, values: (u, values) => values.map((v) => fmtSeconds(v)) }
          : { grid: { stroke: "#eee" }, incrs: STEP_INCREMENTS },
        { size: 56, grid: { stroke: "#eee" }, values: (u, values) => values.map((v) => fmt(v)) },
      ],
    };
  }

  /** Draw `data` (uPlot's column format); creates the plot the first time. */
  update(data) {
    const width = Math.max(240, this.canvasBox.clientWidth || 400);
    if (!this.plot) this.plot = new uPlot(this.options(width), data, this.canvasBox);
    else this.plot.setData(data);
    const counts = data.slice(1).map((column) => column.filter((v) => v != null).length);
    this.el.dataset.points = String(data[0].length);
    this.el.dataset.values = String(counts.reduce((a, b) => a + b, 0));
    this.el.dataset.series = String(counts.filter((n) => n > 0).length);
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
