// Small DOM and formatting helpers shared by the pages.

/** Build an element: h("a", {href: "#/", class: "x", onclick: fn}, "text", child, [more]). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (["value", "checked", "disabled", "selected", "open"].includes(key)) el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

/** A number for people: integers as they are, others to 4 significant digits, null as an en dash. */
export function fmt(value) {
  if (value === null || value === undefined || value === "") return "–";
  if (typeof value !== "number") return String(value);
  if (!Number.isFinite(value)) return String(value);
  if (Number.isInteger(value)) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return String(Number(value.toPrecision(4)));
}

/** Seconds for people: "45 s", "12.5 min", "3.2 h" (null as an en dash). */
export function fmtSeconds(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const abs = Math.abs(value);
  if (abs < 120) return `${Number(value.toPrecision(3))} s`;
  if (abs < 7200) return `${Number((value / 60).toPrecision(3))} min`;
  return `${Number((value / 3600).toPrecision(3))} h`;
}

/** "12 s ago" / "3 min ago" / a date, for a unix time in seconds. */
export function ago(unix) {
  if (!unix) return "–";
  const seconds = Date.now() / 1000 - unix;
  if (seconds < 0) return "just now";
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(unix * 1000).toLocaleDateString();
}

export function localTime(unix) {
  return unix ? new Date(unix * 1000).toLocaleString() : "";
}

const STATE_CLASS = {
  running: "ok",
  stuck: "warn",
  finished: "done",
  stopped: "warn",
  dead: "bad",
  failed: "bad",
  unknown: "muted",
};

/** The coloured badge of a run's state; the why shows on hover. */
export function stateBadge(state, why) {
  return h("span", { class: `badge ${STATE_CLASS[state] || "muted"}`, title: why || state }, state || "unknown");
}

/** A progress bar for step / total (total may be null: then only the step is shown). */
export function progress(step, total) {
  const known = typeof total === "number" && total > 0;
  const fraction = known ? Math.max(0, Math.min(1, (step || 0) / total)) : 0;
  return h(
    "div",
    { class: "progress", title: known ? `${Math.round(fraction * 100)}%` : "total unknown" },
    h("div", { class: "bar" }, h("div", { class: "fill", style: `width:${(fraction * 100).toFixed(1)}%` })),
    h("span", { class: "label" }, known ? `${step ?? 0} / ${total}` : `${step ?? 0}`),
  );
}

/** A warning box listing `notes` (nothing when there are none). */
export function notesBox(notes, title = "Notes") {
  if (!notes || notes.length === 0) return null;
  return h(
    "div",
    { class: "notes", role: "alert" },
    h("strong", {}, title),
    h("ul", {}, notes.map((note) => h("li", {}, note))),
  );
}

/** An error box for a failed load inside a page. */
export function errorBox(error) {
  return h("div", { class: "error-box", role: "alert" }, error instanceof Error ? error.message : String(error));
}

/** Run `fn` now and again `ms` after each finish (never overlapping); returns a stop function. */
export function every(ms, fn) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    try {
      await fn();
    } catch (err) {
      console.warn(err);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** `fn` called `ms` after the last of a burst of calls. */
export function debounce(ms, fn) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

export function enc(part) {
  return encodeURIComponent(part);
}

/** The breadcrumb trail in the top bar: setCrumbs(["run-1", "#/run/run-1"], ["experiences"]). */
export function setCrumbs(...items) {
  const crumbs = document.getElementById("crumbs");
  if (!crumbs) return;
  crumbs.replaceChildren(
    ...items.flatMap(([label, href], i) => [
      i ? h("span", { class: "sep" }, "›") : h("span", { class: "sep" }, "·"),
      href ? h("a", { href }, label) : h("span", {}, label),
    ]),
  );
}

/** Replace the children of `el` (null/false left out, arrays flattened, strings as text). */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}
