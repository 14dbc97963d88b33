// The one way the pages talk to the studio's HTTP API: JSON in, JSON out, errors shown in the banner.
// The studio's own token travels as the cookie that opening `/?token=...` sets; an annotator's token is
// kept in localStorage and sent as X-Annotator-Token on the annotation endpoints.

const ANNOTATOR_KEY = "trine.annotatorToken";

export function annotatorToken() {
  return localStorage.getItem(ANNOTATOR_KEY) || "";
}

export function setAnnotatorToken(token) {
  if (token) localStorage.setItem(ANNOTATOR_KEY, token);
  else localStorage.removeItem(ANNOTATOR_KEY);
}

/** An HTTP error from the API: `status` (0 when the server did not answer) and the body's `detail`. */
export class ApiError extends Error {
  constructor(status, detail, where) {
    super(`${where}: ${describe(status, detail)}`);
    this.status = status;
    this.detail = detail;
  }
}

function describe(status, detail) {
  if (detail == null || detail === "") return `HTTP ${status}`;
  if (typeof detail === "string") return status ? `${detail} (HTTP ${status})` : detail;
  if (Array.isArray(detail)) {
    // FastAPI's own 422 for a malformed request: [{loc, msg}]
    return detail.map((d) => (d.loc ? `${d.loc.join(".")}: ${d.msg}` : JSON.stringify(d))).join("; ");
  }
  if (detail.message) return detail.message;
  if (Array.isArray(detail.errors)) return detail.errors.map((e) => e.message || e).join("; ");
  return JSON.stringify(detail);
}

/**
 * Call `/api` + `path`. Options: method, body (sent as JSON), annotator (send the annotator token),
 * quiet (do not show the error banner: the caller shows it where it belongs).
 * Resolves to the parsed JSON; rejects with ApiError.
 */
export async function api(path, { method = "GET", body, annotator = false, quiet = false } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (annotator && annotatorToken()) headers["X-Annotator-Token"] = annotatorToken();
  const where = `${method} /api${path.split("?")[0]}`;
  let response;
  try {
    response = await fetch(`/api${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
    });
  } catch (err) {
    const error = new ApiError(0, `the studio did not answer (${err.message}); is \`trine studio\` still running?`, where);
    if (!quiet) showError(error);
    throw error;
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    const detail = data && typeof data === "object" && "detail" in data ? data.detail : data;
    const error = new ApiError(response.status, detail, where);
    if (!quiet) showError(error);
    throw error;
  }
  return data;
}

/** A query string from an object, leaving out empty values: {a: 1, b: ""} -> "?a=1". */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

let lastMessage = "";
let repeats = 0;

/** Show an error in the banner under the top bar (the same message again counts up instead of stacking). */
export function showError(error) {
  const banner = document.getElementById("error-banner");
  if (!banner) return;
  const message = error instanceof Error ? error.message : String(error);
  repeats = message === lastMessage && !banner.hidden ? repeats + 1 : 1;
  lastMessage = message;
  banner.replaceChildren();
  const text = document.createElement("span");
  text.textContent = repeats > 1 ? `${message} (×${repeats})` : message;
  const close = document.createElement("button");
  close.className = "link";
  close.textContent = "dismiss";
  close.addEventListener("click", clearError);
  banner.append(text, close);
  banner.hidden = false;
}

export function clearError() {
  const banner = document.getElementById("error-banner");
  if (banner) banner.hidden = true;
  lastMessage = "";
}
