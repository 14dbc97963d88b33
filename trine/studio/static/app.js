// The studio's entry point: a hash router that mounts one page module at a time into <main id="page">.
// A page module exports mount(root, params, query) and may return a cleanup function (stop polling...).

import { api, clearError } from "./api.js";
import * as annotate from "./annotate.js";
import * as compare from "./compare.js";
import * as config from "./config.js";
import * as experience from "./experience.js";
import * as experiences from "./experiences.js";
import * as run from "./run.js";
import * as runs from "./runs.js";
import { h, setCrumbs } from "./util.js";

const ROUTES = [
  [/^\/?$/, runs, []],
  [/^\/config$/, config, []],
  [/^\/compare$/, compare, []],
  [/^\/run\/([^/]+)$/, run, ["name"]],
  [/^\/run\/([^/]+)\/experiences$/, experiences, ["name"]],
  [/^\/run\/([^/]+)\/experience\/([^/]+)$/, experience, ["name", "id"]],
  [/^\/run\/([^/]+)\/annotate$/, annotate, ["name"]],
];

let cleanup = null;

/** The current hash as {path, query}: "#/run/a/experiences?reward_min=1" -> "/run/a/experiences", params. */
export function parseHash(hash = location.hash) {
  const text = hash.replace(/^#/, "") || "/";
  const at = text.indexOf("?");
  const path = at < 0 ? text : text.slice(0, at);
  return { path, query: new URLSearchParams(at < 0 ? "" : text.slice(at + 1)) };
}

function route() {
  if (cleanup) {
    try {
      cleanup();
    } catch (err) {
      console.warn(err);
    }
    cleanup = null;
  }
  clearError();
  setCrumbs();
  const { path, query } = parseHash();
  const root = document.getElementById("page");
  root.replaceChildren();
  for (const nav of document.querySelectorAll("[data-nav]")) {
    nav.classList.toggle("active", nav.dataset.nav === (path.startsWith("/config") ? "config" : "runs"));
  }
  for (const [pattern, page, names] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    const params = Object.fromEntries(names.map((n, i) => [n, decodeURIComponent(match[i + 1])]));
    document.body.dataset.page = page.NAME || "";
    const result = page.mount(root, params, query);
    cleanup = typeof result === "function" ? result : null;
    return;
  }
  root.append(h("div", { class: "error-box" }, `No page at #${path}. `, h("a", { href: "#/" }, "Back to the runs")));
}

async function showRunsDir() {
  try {
    const data = await api("/runs", { quiet: true });
    document.getElementById("runs-dir").textContent = data.runs_dir || "";
  } catch {
    // the runs page shows the error itself
  }
}

window.addEventListener("hashchange", route);
route();
showRunsDir();
