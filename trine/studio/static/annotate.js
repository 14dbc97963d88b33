// Annotate page (#/run/NAME/annotate): the annotator's token (kept in this browser), the queue's counts,
// "Get batch" to claim items, A / B / Tie for pairs and a scale for ratings, "Submit batch" sends every
// answer at once (all or nothing: conflicts come back with their items), and the Label Studio export.

import { annotatorToken, api, setAnnotatorToken } from "./api.js";
import { fill, enc, errorBox, every, fmt, h, setCrumbs } from "./util.js";

export const NAME = "annotate";

export function mount(root, { name }) {
  setCrumbs([name, `#/run/${enc(name)}`], ["annotate"]);
  const base = `/runs/${enc(name)}/annotations`;
  const answers = new Map();
  let items = [];

  const who = h("span", { class: "who muted" });
  const tokenInput = h("input", {
    id: "annotator-token",
    type: "password",
    placeholder: "annotator token",
    value: annotatorToken(),
  });
  const counts = h("div", { class: "counts" });
  const batchSize = h("input", { id: "batch-size", type: "number", min: "1", max: "100", value: "10" });
  const claimButton = h("button", { id: "get-batch", onclick: () => claim() }, "Get batch");
  const submitButton = h("button", { id: "submit-batch", class: "primary", disabled: true, onclick: () => submit() });
  const message = h("div", { class: "annotate-message" });
  const list = h("div", { class: "items" });
  const exportLink = h(
    "a",
    { href: `/api${base}/export`, download: `${name}-labelstudio.json`, id: "export" },
    "Export Label Studio JSON",
  );

  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Annotate"), exportLink),
    h(
      "div",
      { class: "token-bar" },
      h("label", { class: "field inline" }, h("span", {}, "your token"), tokenInput),
      h("button", { onclick: () => saveToken() }, "Use token"),
      h("button", { class: "link", onclick: () => forgetToken() }, "forget"),
      who,
    ),
    counts,
    h(
      "div",
      { class: "claim-bar" },
      h("label", { class: "field inline" }, h("span", {}, "items"), batchSize),
      claimButton,
      submitButton,
    ),
    message,
    list,
  );

  async function checkToken() {
    if (!annotatorToken()) {
      who.textContent = "Enter the token `trine studio --annotator NAME` printed for you.";
      return;
    }
    try {
      const me = await api("/annotator", { annotator: true, quiet: true });
      fill(who, "annotating as ", h("strong", { id: "annotator-name" }, me.name));
    } catch (err) {
      fill(who, errorBox(err));
    }
  }

  function saveToken() {
    setAnnotatorToken(tokenInput.value.trim());
    checkToken();
  }

  function forgetToken() {
    setAnnotatorToken("");
    tokenInput.value = "";
    checkToken();
  }

  async function refreshCounts() {
    try {
      const data = await api(base, { quiet: true });
      const c = data.counts || {};
      const batches = (data.batches || []).length;
      fill(
        counts,
        ["open", "claimed", "answered", "landed", "expired", "ties"].map((k) =>
          h("span", { class: "chip", dataset: { count: k } }, `${k} `, h("strong", {}, fmt(c[k] ?? 0))),
        ),
        batches ? h("span", { class: "muted small" }, ` · ${batches} batch${batches === 1 ? "" : "es"}`) : null,
      );
    } catch (err) {
      fill(counts, h("span", { class: "muted small" }, `queue counts unavailable: ${err.message}`));
    }
  }

  async function claim() {
    fill(message);
    try {
      const body = { n: Number(batchSize.value) || 10 };
      const data = await api(`${base}/claim`, { method: "POST", body, annotator: true, quiet: true });
      items = data.items || [];
      answers.clear();
      render();
      fill(
        message,
        items.length
          ? `${items.length} item${items.length === 1 ? "" : "s"} claimed.`
          : h("span", { class: "muted" }, "Nothing open in the queue right now."),
      );
    } catch (err) {
      fill(message, errorBox(err));
    }
    refreshCounts();
  }

  function render(conflicts = new Map()) {
    fill(list, ...items.map((item, i) => itemCard(item, i, conflicts.get(item.id))));
    const done = items.filter((item) => answers.has(item.id)).length;
    submitButton.disabled = done === 0;
    submitButton.textContent = items.length ? `Submit batch (${done}/${items.length})` : "Submit batch";
  }

  function choose(item, answer) {
    answers.set(item.id, answer);
    render();
  }

  function itemCard(item, i, conflict) {
    const answer = answers.get(item.id) || {};
    const text = (j) => h("pre", {}, item.responses[j]?.text ?? "");
    const body =
      item.kind === "pair"
        ? h(
            "div",
            { class: "pair" },
            ["a", "b"].map((side, j) =>
              h(
                "div",
                { class: `response ${answer.choice === side ? "chosen" : ""}` },
                h("div", { class: "response-label" }, side.toUpperCase()),
                text(j),
              ),
            ),
          )
        : h("div", { class: "response single" }, text(0));
    const controls =
      item.kind === "pair"
        ? ["a", "b", "tie"].map((choice) =>
            h(
              "button",
              { class: choiceClass(answer.choice === choice), dataset: { choice }, onclick: () => choose(item, { choice }) },
              choice === "tie" ? "Tie" : `${choice.toUpperCase()} is better`,
            ),
          )
        : rateControls(item, answer, (rating) => choose(item, { rating }));
    const expires = item.expires_at ? ` · expires ${new Date(item.expires_at * 1000).toLocaleTimeString()}` : "";
    return h(
      "div",
      {
        class: `item ${conflict ? "conflict" : ""} ${answers.has(item.id) ? "answered" : ""}`,
        dataset: { item: item.id, kind: item.kind },
      },
      h(
        "div",
        { class: "item-head" },
        h("strong", {}, `${i + 1}. ${item.kind === "pair" ? "Which response is better?" : "Rate this response"}`),
        h("span", { class: "muted small" }, ` ${item.id}${expires}`),
      ),
      conflict
        ? h("div", { class: "error-box" }, conflict, " ", h("button", { class: "link", onclick: () => drop(item) }, "drop this item"))
        : null,
      h("div", { class: "prompt" }, h("div", { class: "response-label" }, "Prompt"), promptView(item)),
      body,
      h("div", { class: "controls" }, controls),
    );
  }

  function drop(item) {
    items = items.filter((other) => other.id !== item.id);
    answers.delete(item.id);
    render();
  }

  async function submit() {
    const payload = items
      .filter((item) => answers.has(item.id))
      .map((item) => ({ item: item.id, ...answers.get(item.id) }));
    submitButton.disabled = true;
    try {
      const body = { answers: payload };
      const result = await api(`${base}/answer`, { method: "POST", body, annotator: true, quiet: true });
      const text = `Submitted: ${result.answered} answered, ${result.landed} landed in the buffer.`;
      fill(message, h("div", { class: "success", id: "submit-result" }, text, result.note ? ` ${result.note}` : ""));
      items = items.filter((item) => !answers.has(item.id));
      answers.clear();
      render();
    } catch (err) {
      const detail = err.detail && typeof err.detail === "object" ? err.detail : {};
      const conflicts = new Map();
      for (const entry of detail.items || []) {
        if (typeof entry === "string") conflicts.set(entry, detail.message || "refused");
        else conflicts.set(entry.item || entry.id, entry.why || entry.message || "refused");
      }
      const why = conflicts.size
        ? `Nothing was kept: ${conflicts.size} answer${conflicts.size === 1 ? " was" : "s were"} refused (marked below). ` +
          "Drop those items and submit the others again."
        : err;
      fill(message, errorBox(why));
      render(conflicts);
    }
    refreshCounts();
  }

  checkToken();
  render();
  return every(5000, refreshCounts);
}

/** The prompt: its conversation message by message (role, then text) when the item has one, else its text. */
function promptView(item) {
  if (!Array.isArray(item.messages) || !item.messages.length) return h("pre", {}, item.prompt);
  return h(
    "ol",
    { class: "messages" },
    item.messages.map((m) =>
      h("li", { class: "message", dataset: { role: m.role } }, h("div", { class: "turn-role" }, m.role), h("pre", {}, m.content)),
    ),
  );
}

function choiceClass(selected) {
  return selected ? "choice selected" : "choice";
}

/** Buttons for a small integer scale, otherwise a slider (the answer is set when it is released). */
function rateControls(item, answer, onRate) {
  const [lo, hi] = item.scale || [0, 1];
  if (Number.isInteger(lo) && Number.isInteger(hi) && hi - lo <= 10) {
    const values = Array.from({ length: hi - lo + 1 }, (_, i) => lo + i);
    return values.map((v) =>
      h("button", { class: choiceClass(answer.rating === v), dataset: { rating: String(v) }, onclick: () => onRate(v) }, String(v)),
    );
  }
  const start = answer.rating ?? (lo + hi) / 2;
  const shown = h("span", { class: "rating-value" }, fmt(start));
  const slider = h("input", {
    type: "range",
    min: String(lo),
    max: String(hi),
    step: String((hi - lo) / 100),
    value: String(start),
    oninput: (e) => (shown.textContent = fmt(Number(e.target.value))),
    onchange: (e) => onRate(Number(e.target.value)),
  });
  return [h("span", { class: "muted small" }, fmt(lo)), slider, h("span", { class: "muted small" }, fmt(hi)), shown];
}
