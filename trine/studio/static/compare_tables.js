// The compare page's tables: the evals side by side and the resolved configs diffed key by key (the data
// comes from GET /api/compare: trine/studio/compare.py's eval_summary and config_diff).

import { fmt, h } from "./util.js";

const SOURCES = { run: "during the run (metrics.jsonl)", bench: "trine bench (bench.jsonl)" };

/** One row per source, taskset and metric; per run the last value (and its step) and the best (highest)
 * value (and its step). The highest last value of a row is marked. */
export function renderEvals(rows, names) {
  if (!rows || !rows.length) return h("p", { class: "muted" }, "None of these runs has logged an evaluation yet.");
  return h(
    "table",
    { class: "grid compact compare-evals" },
    h(
      "thead",
      {},
      h("tr", {}, h("th", { rowspan: 2 }, "source"), h("th", { rowspan: 2 }, "taskset"), h("th", { rowspan: 2 }, "metric"),
        names.map((name) => h("th", { colspan: 2, class: "run-col" }, name))),
      h("tr", {}, names.map(() => [h("th", { class: "num" }, "last"), h("th", { class: "num" }, "best")])),
    ),
    h(
      "tbody",
      {},
      rows.map((row) => {
        const lasts = names.map((name) => (row.runs[name] ? row.runs[name].last : null)).filter((v) => v !== null);
        const top = lasts.length > 1 && Math.min(...lasts) < Math.max(...lasts) ? Math.max(...lasts) : null;
        return h(
          "tr",
          { dataset: { source: row.source, taskset: row.taskset, metric: row.metric } },
          h("td", { title: SOURCES[row.source] || row.source }, row.source),
          h("td", {}, row.taskset),
          h("td", {}, row.metric),
          names.map((name) => {
            const cell = row.runs[name];
            if (!cell) return [h("td", { class: "num muted", dataset: { run: name } }, "–"), h("td", { class: "num muted" }, "–")];
            return [
              h("td", { class: `num last${cell.last === top ? " top" : ""}`, dataset: { run: name } }, fmt(cell.last), at(cell.last_step)),
              h("td", { class: "num best" }, fmt(cell.best), at(cell.best_step)),
            ];
          }),
        );
      }),
    ),
  );
}

function at(step) {
  return h("span", { class: "muted small" }, ` @${step}`);
}

/** The keys whose values differ (or every key, with `all`), one column per run; a key a run lacks is
 * "absent"; a run whose config could not be read has no column values (its notes say why). */
export function renderConfigDiff(config, names, all, onToggle) {
  const withConfig = new Set(config.runs);
  const rows = all ? config.keys : config.keys.filter((k) => k.differs);
  const toggle = h(
    "label",
    { class: "field inline" },
    h("input", { type: "checkbox", id: "all-keys", checked: all, onchange: (event) => onToggle(event.target.checked) }),
    `show all ${config.total} keys`,
  );
  const summary = h(
    "p",
    { class: "diff-summary" },
    `${config.differing} of ${config.total} keys differ between the ${withConfig.size} runs with a config.yaml`,
    " ",
    toggle,
  );
  if (!rows.length) {
    const none = config.total ? "Every key has the same value in every run." : "No run here has a readable config.yaml.";
    return [summary, h("p", { class: "muted" }, none)];
  }
  return [
    summary,
    h(
      "table",
      { class: "grid compact config-diff" },
      h("thead", {}, h("tr", {}, h("th", {}, "key"), names.map((name) => h("th", {}, withConfig.has(name) ? name : `${name} (no config)`)))),
      h(
        "tbody",
        {},
        rows.map((row) =>
          h(
            "tr",
            { class: row.differs ? "differs" : "", dataset: { key: row.key } },
            h("td", { class: "key" }, h("code", {}, row.key)),
            names.map((name) => h("td", { dataset: { run: name } }, cell(row, name, withConfig))),
          ),
        ),
      ),
    ),
  ];
}

function cell(row, name, withConfig) {
  if (!withConfig.has(name)) return h("span", { class: "muted" }, "–");
  if (!(name in row.values)) return h("span", { class: "absent" }, "absent");
  const value = row.values[name];
  return h("code", {}, typeof value === "string" ? value : JSON.stringify(value));
}
