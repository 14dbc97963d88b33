// Config page (#/config): load a template, edit the YAML, see every validation error at its line (checked
// ~300 ms after each change with the same rules as `trine validate`), read the docs of the key under the
// cursor, and start the run.

import { api, query } from "./api.js";
import { fill, debounce, enc, errorBox, h, setCrumbs } from "./util.js";
import { childrenOf, lookup, pathAt } from "./yaml_path.js";

export const NAME = "config";

export function mount(root, _params, params) {
  setCrumbs(["config editor"]);
  const state = { fields: {}, errors: [], ok: false, checking: false, request: 0, line: 0, template: null, suggested: "" };
  const templates = h("select", { "aria-label": "template", onchange: (e) => loadTemplate(e.target.value) });
  const textarea = h("textarea", { id: "yaml", spellcheck: "false", wrap: "off", autocomplete: "off", "aria-label": "config YAML" });
  const gutter = h("div", { class: "gutter" });
  const backdrop = h("div", { class: "backdrop", "aria-hidden": "true" });
  const validity = h("div", { id: "validity", class: "validity" }, "Load a template or type a config.");
  const errorList = h("ul", { class: "errors" });
  const docs = h("aside", { class: "docs" }, h("p", { class: "muted" }, "Put the cursor on a key to see its type, default and documentation."));
  const nameInput = h("input", { id: "run-name", type: "text", placeholder: "new run name", oninput: () => updateStart() });
  const startButton = h("button", { id: "start", class: "primary", disabled: true, onclick: () => start() }, "Start run");
  const startResult = h("div", { class: "start-result" });

  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Config"), h("label", { class: "field inline" }, h("span", {}, "template"), templates)),
    h(
      "div",
      { class: "config-layout" },
      h(
        "div",
        { class: "config-main" },
        h("div", { class: "editor-scroll" }, h("div", { class: "editor" }, gutter, h("div", { class: "code-area" }, backdrop, textarea))),
        validity,
        errorList,
        h("div", { class: "start-bar" }, nameInput, startButton, startResult),
      ),
      docs,
    ),
  );

  const validateSoon = debounce(300, validate);
  textarea.addEventListener("input", () => {
    layout();
    validateSoon();
    showDocs();
  });
  textarea.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.isComposing) {
      // keep the indentation of the current line (and go one deeper after "key:")
      event.preventDefault();
      const before = textarea.value.slice(0, textarea.selectionStart);
      const current = before.slice(before.lastIndexOf("\n") + 1);
      const indent = current.match(/^\s*(- )?/)[0].replace("- ", "  ") + (/:\s*$/.test(current) ? "  " : "");
      textarea.setRangeText(`\n${indent}`, textarea.selectionStart, textarea.selectionEnd, "end");
      textarea.dispatchEvent(new Event("input"));
    } else if (event.key === "Tab") {
      event.preventDefault();
      textarea.setRangeText("  ", textarea.selectionStart, textarea.selectionEnd, "end");
      textarea.dispatchEvent(new Event("input"));
    }
  });
  for (const type of ["click", "keyup", "select", "focus"]) textarea.addEventListener(type, showDocs);

  function lines() {
    return textarea.value.split("\n");
  }

  /** Size the textarea to its text (the outer box scrolls) and redraw the gutter and the error marks. */
  function layout() {
    const all = lines();
    const longest = Math.max(40, ...all.map((l) => l.length));
    textarea.style.height = `calc(${all.length} * var(--line) + 2 * var(--pad))`;
    textarea.style.width = `max(100%, calc(${longest + 4}ch + 2 * var(--pad)))`;
    const byLine = new Map();
    for (const error of state.errors) {
      const line = error.line && error.line <= all.length ? error.line : null;
      if (line) byLine.set(line, [...(byLine.get(line) || []), error]);
    }
    fill(
      gutter,
      ...all.map((_, i) => {
        const errors = byLine.get(i + 1);
        const attrs = { class: errors ? "ln err" : "ln", dataset: { line: String(i + 1) } };
        if (errors) attrs.title = errors.map(message).join("\n");
        return h("div", attrs, errors ? `● ${i + 1}` : String(i + 1));
      }),
    );
    fill(
      backdrop,
      ...all.map((text, i) => {
        const errors = byLine.get(i + 1);
        return h(
          "div",
          { class: errors ? "bl err" : "bl" },
          h("span", { class: "ghost" }, text),
          errors
            ? h("span", { class: "inline-error", dataset: { line: String(i + 1) } }, `  ◀ ${errors.map((e) => e.message).join(" · ")}`)
            : null,
        );
      }),
    );
  }

  async function validate() {
    const mine = ++state.request;
    state.checking = true;
    updateStart();
    validity.className = "validity checking";
    validity.textContent = "Checking…";
    let result;
    try {
      const body = { yaml: textarea.value, template: state.template || null };
      result = await api("/config/validate", { method: "POST", body, quiet: true });
    } catch (err) {
      if (mine !== state.request) return;
      state.checking = false;
      state.ok = false;
      validity.dataset.ok = "false";
      validity.className = "validity bad";
      fill(validity, errorBox(err));
      updateStart();
      return;
    }
    if (mine !== state.request) return;
    state.checking = false;
    state.ok = Boolean(result.ok);
    state.errors = result.errors || [];
    validity.dataset.ok = String(state.ok);
    validity.className = `validity ${state.ok ? "good" : "bad"}`;
    validity.textContent = state.ok
      ? `✓ valid${result.stages && result.stages.length ? ` — stages: ${result.stages.join(" → ")}` : ""}`
      : `${state.errors.length} error${state.errors.length === 1 ? "" : "s"}`;
    fill(
      errorList,
      ...state.errors.map((e) =>
        h(
          "li",
          { dataset: { line: e.line ? String(e.line) : "" }, onclick: () => e.line && goTo(e.line) },
          h("span", { class: "at" }, e.line ? `line ${e.line}` : "—"),
          " ",
          message(e),
        ),
      ),
    );
    layout();
    updateStart();
    showDocs();
  }

  function goTo(line) {
    const all = lines();
    const start = all.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    textarea.focus();
    textarea.setSelectionRange(start, start + (all[line - 1] || "").length);
    showDocs();
  }

  function showDocs() {
    const all = lines();
    const index = textarea.value.slice(0, textarea.selectionStart).split("\n").length - 1;
    const path = pathAt(all, index);
    const field = lookup(state.fields, path);
    const here = state.errors.filter((e) => e.line === index + 1);
    const parent = field ? field.path.split(".").slice(0, -1).join(".") : "";
    fill(
      docs,
      h(
        "div",
        {},
      h("div", { class: "doc-path" }, path ? h("code", {}, path) : h("span", { class: "muted" }, "no key on this line")),
      field
        ? [
            h("div", { class: "doc-type" }, h("span", { class: "muted" }, "type "), h("code", {}, field.type || "section")),
            field.section
              ? null
              : h("div", { class: "doc-default" }, h("span", { class: "muted" }, "default "), h("code", {}, JSON.stringify(field.default))),
            h("p", { class: "doc-text" }, field.doc || ""),
          ]
        : path
          ? h("p", { class: "muted" }, "Not a field of the config schema (a free-form value, a list item, or a typo).")
          : null,
      here.map((e) => h("div", { class: "error-box" }, message(e))),
      fieldList(state.fields, field && field.section ? field.path : parent),
      ),
    );
  }

  function updateStart() {
    const name = nameInput.value.trim();
    startButton.disabled = !state.ok || state.checking || !name;
    startButton.title = !state.ok ? "fix the errors first" : !name ? "give the run a name" : "";
  }

  async function start() {
    startButton.disabled = true;
    fill(startResult, h("span", { class: "muted" }, "Starting…"));
    try {
      const body = { yaml: textarea.value, name: nameInput.value.trim(), template: state.template || null };
      const result = await api("/config/start", { method: "POST", body, quiet: true });
      const link = h("a", { href: `#/run/${enc(result.name)}`, id: "started-link" }, result.name);
      fill(startResult, "Started ", link, ` (pid ${result.pid}).`, result.note ? h("div", { class: "muted small" }, result.note) : null);
    } catch (err) {
      const errors = err.detail && err.detail.errors;
      fill(startResult, errorBox(errors ? errors.map(message).join("; ") : err));
    }
    updateStart();
  }

  async function loadTemplate(id) {
    if (!id) return;
    try {
      const data = await api(`/config/template${query({ id })}`, { quiet: true });
      textarea.value = data.yaml;
      state.template = id; // a --config file's relative paths resolve against its own directory
      // a fresh name (the template's run is never written into): kept if the user typed their own
      if (data.name && (!nameInput.value || nameInput.value === state.suggested)) nameInput.value = data.name;
      state.suggested = data.name;
      layout();
      validate();
    } catch (err) {
      fill(validity, errorBox(err));
    }
  }

  async function init() {
    layout();
    try {
      const [schema, list] = await Promise.all([
        api("/config/schema", { quiet: true }),
        api("/config/templates", { quiet: true }),
      ]);
      state.fields = schema.fields || {};
      fill(
        templates,
        h("option", { value: "" }, list.templates.length ? "— load a template —" : "(no templates)"),
        list.templates.map((t) => h("option", { value: t.id }, t.label || t.id)),
      );
      const wanted = params.get("template");
      if (wanted) {
        templates.value = wanted;
        await loadTemplate(wanted);
      }
    } catch (err) {
      fill(docs, errorBox(err));
    }
  }

  init();
}

function message(error) {
  return error.path ? `${error.path}: ${error.message}` : error.message;
}

function fieldList(fields, section) {
  const names = childrenOf(fields, section);
  if (!names.length) return null;
  return h(
    "details",
    { class: "doc-siblings" },
    h("summary", {}, `fields of ${section || "the top level"} (${names.length})`),
    h(
      "ul",
      {},
      names.map((p) =>
        h("li", { title: fields[p].doc || "" }, h("code", {}, p.split(".").pop()), h("span", { class: "muted" }, ` ${fields[p].type || ""}`)),
      ),
    ),
  );
}
