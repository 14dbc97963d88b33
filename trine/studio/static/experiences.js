// Experiences page (#/run/NAME/experiences): filter bar (options from /facets), a paged table (50 a page)
// sorted by sequence or reward; a row opens the experience. The filters live in the address (#...?k=v),
// so the back button from an experience returns to the same view.

import { api, query } from "./api.js";
import { fill, debounce, enc, errorBox, fmt, h, setCrumbs } from "./util.js";

export const NAME = "experiences";

const PAGE = 50;
const SELECTS = ["stage", "status", "kind", "finish_reason"];
const RANGES = [
  ["reward", "Reward", "reward"],
  ["version", "Policy version", "version"],
  ["step", "Explore step", "batch"],
];
const ORDERS = [
  ["seq", "oldest first"],
  ["-seq", "newest first"],
  ["-reward", "reward high→low"],
  ["reward", "reward low→high"],
];
const FIELDS = [...SELECTS, "task", ...RANGES.flatMap(([key]) => [`${key}_min`, `${key}_max`])];

export function mount(root, { name }, params) {
  setCrumbs([name, `#/run/${enc(name)}`], ["experiences"]);
  const base = `/runs/${enc(name)}/experiences`;
  const state = Object.fromEntries(FIELDS.map((f) => [f, params.get(f) || ""]));
  state.order = params.get("order") || "seq";
  state.offset = Number(params.get("offset") || 0);
  let request = 0;

  const bar = h("form", { class: "filters", onsubmit: (e) => e.preventDefault() });
  const summary = h("div", { class: "summary muted" });
  const note = h("div");
  const tableBox = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const pager = h("div", { class: "pager" });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Experiences"), summary), bar, note, tableBox, pager);

  function syncAddress() {
    const text = query({ ...state, order: state.order === "seq" ? "" : state.order, offset: state.offset || "" });
    history.replaceState(null, "", `#/run/${enc(name)}/experiences${text}`);
  }

  function changed(field, value) {
    state[field] = value;
    state.offset = 0;
    if (field === "stage") buildBar(); // the options and ranges are the stage's buffer's
    load();
  }

  const loadSoon = debounce(400, load);
  function typed(field, value) {
    state[field] = value;
    state.offset = 0;
    syncAddress();
    loadSoon();
  }

  async function load() {
    const mine = ++request;
    syncAddress();
    summary.textContent = "Querying…";
    let data;
    try {
      data = await api(`${base}${query({ ...state, limit: PAGE })}`, { quiet: true });
    } catch (err) {
      if (mine === request) {
        fill(tableBox, errorBox(err));
        summary.textContent = "";
      }
      return;
    }
    if (mine !== request) return;
    const last = Math.min(data.offset + data.rows.length, data.total);
    fill(
      summary,
      h("span", { class: "total", dataset: { total: String(data.total) } }, `${data.total} experience${data.total === 1 ? "" : "s"}`),
      ` · rows ${data.total ? data.offset + 1 : 0}–${last} · ${fmt(data.query_ms)} ms · source ${data.source}`,
    );
    fill(note, data.note ? h("div", { class: "notes" }, data.note) : "");
    fill(tableBox, data.rows.length ? table(data.rows) : h("p", { class: "empty" }, "No experience matches these filters."));
    renderPager(data);
  }

  function renderPager(data) {
    const go = (offset) => {
      state.offset = Math.max(0, offset);
      load();
      window.scrollTo(0, 0);
    };
    fill(
      pager,
      h("button", { disabled: data.offset <= 0, onclick: () => go(data.offset - PAGE) }, "← Prev"),
      h("span", { class: "muted" }, `page ${Math.floor(data.offset / PAGE) + 1} of ${Math.max(1, Math.ceil(data.total / PAGE))}`),
      h("button", { disabled: data.offset + PAGE >= data.total, onclick: () => go(data.offset + PAGE) }, "Next →"),
    );
  }

  function sortByReward() {
    changed("order", state.order === "-reward" ? "reward" : "-reward");
  }

  function table(rows) {
    const arrow = state.order === "-reward" ? " ↓" : state.order === "reward" ? " ↑" : "";
    const heads = ["id", "step", "task", "group", "version", "reward", "status", "kind", "finish", "len p/r", "preview"];
    const stage = state.stage ? `?stage=${enc(state.stage)}` : "";
    return h(
      "table",
      { class: "grid compact experiences" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          heads.map((t) =>
            t === "reward"
              ? h("th", { class: "sortable", title: "sort by reward", onclick: sortByReward }, `reward${arrow}`)
              : h("th", {}, t),
          ),
        ),
      ),
      h(
        "tbody",
        {},
        rows.map((r) => {
          const href = `#/run/${enc(name)}/experience/${enc(r.id)}${stage}`;
          return h(
            "tr",
            { class: "clickable", dataset: { id: r.id }, onclick: () => (location.hash = href) },
            h("td", {}, h("a", { href, title: `seq ${r.seq}` }, shortId(r.id))),
            h("td", { class: "num" }, fmt(r.batch ?? r.step)),
            h("td", { title: r.task_id }, r.task_id),
            h("td", { title: r.group_id, class: "muted" }, shortId(r.group_id || "")),
            h("td", { class: "num" }, fmt(r.policy_version)),
            h("td", { class: "num reward" }, fmt(r.reward)),
            h("td", {}, h("span", { class: `status s-${r.status}` }, r.status)),
            h("td", {}, r.kind),
            h("td", {}, r.finish_reason || "–"),
            h("td", { class: "num" }, `${fmt(r.prompt_length)}/${fmt(r.response_length)}`),
            h("td", { class: "preview" }, r.preview || ""),
          );
        }),
      ),
    );
  }

  async function buildBar() {
    let facets = {};
    let stages = [];
    try {
      [facets, stages] = await Promise.all([
        api(`${base}/facets${query({ stage: state.stage })}`, { quiet: true }),
        api(`/runs/${enc(name)}`, { quiet: true }).then((r) => (r.stages || []).map((s) => s.name)),
      ]);
    } catch (err) {
      fill(note, errorBox(err));
    }
    const options = {
      stage: stages.length > 1 ? stages : [],
      status: Object.entries(facets.statuses || {}).map(([s, n]) => [s, `${s} (${n})`]),
      kind: facets.kinds || [],
      finish_reason: facets.finish_reasons || [],
    };
    const controls = SELECTS.filter((f) => f !== "stage" || options.stage.length).map((field) =>
      label(field.replace("_", " "), selectFor(field, options[field], state[field], changed)),
    );
    const tasks = h("datalist", { id: "task-options" }, (facets.tasks || []).map((t) => h("option", { value: t })));
    controls.push(
      label(
        "task",
        h("input", {
          type: "text",
          list: "task-options",
          name: "task",
          value: state.task,
          placeholder: "task id",
          oninput: (e) => typed("task", e.target.value.trim()),
        }),
      ),
      tasks,
    );
    for (const [key, text, facet] of RANGES) {
      const range = facets[facet] || null;
      controls.push(
        label(
          text,
          h(
            "span",
            { class: "range" },
            numberInput(`${key}_min`, state[`${key}_min`], range ? `≥ ${fmt(range[0])}` : "min", typed),
            numberInput(`${key}_max`, state[`${key}_max`], range ? `≤ ${fmt(range[1])}` : "max", typed),
          ),
        ),
      );
    }
    controls.push(
      label("order", selectFor("order", ORDERS, state.order, changed, false)),
      h("button", { type: "button", class: "link", onclick: () => reset() }, "clear filters"),
    );
    fill(bar, ...controls);
  }

  function reset() {
    for (const field of FIELDS) state[field] = "";
    state.offset = 0;
    buildBar();
    load();
  }

  buildBar();
  load();
}

function label(text, control) {
  return h("label", { class: "field" }, h("span", {}, text), control);
}

function selectFor(field, values, current, onChange, any = true) {
  const items = values.map((v) => (Array.isArray(v) ? v : [v, v]));
  const select = h(
    "select",
    { name: field, onchange: (e) => onChange(field, e.target.value) },
    any ? h("option", { value: "" }, "any") : null,
    items.map(([value, text]) => h("option", { value }, text)),
  );
  if (current && !items.some(([value]) => value === current)) select.append(h("option", { value: current }, current));
  select.value = current || "";
  return select;
}

function numberInput(field, value, placeholder, onChange) {
  return h("input", {
    type: "number",
    step: "any",
    name: field,
    value,
    placeholder,
    oninput: (e) => onChange(field, e.target.value.trim()),
  });
}

function shortId(id) {
  return id.length > 14 ? `${id.slice(0, 12)}…` : id;
}
