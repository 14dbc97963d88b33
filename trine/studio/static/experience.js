// Experience page (#/run/NAME/experience/ID): the tokens (prompt grey, observations boxed, model tokens
// coloured by logprob or advantage), reward and its parts, info, the group, the turns and the steps.

import { api, query } from "./api.js";
import { fill, enc, errorBox, fmt, h, setCrumbs } from "./util.js";

export const NAME = "experience";

export function mount(root, { name, id }, params) {
  setCrumbs([name, `#/run/${enc(name)}`], ["experiences", `#/run/${enc(name)}/experiences`], [id]);
  const stage = params.get("stage") || "";
  root.append(h("p", { class: "muted" }, "Loading…"));
  api(`/runs/${enc(name)}/experiences/${enc(id)}${query({ stage })}`, { quiet: true })
    .then((data) => fill(root, ...render(data, name, stage)))
    .catch((err) => fill(root, errorBox(err)));
}

function render(data, run, stage) {
  const e = data.experience;
  const link = (otherId) => `#/run/${enc(run)}/experience/${enc(otherId)}${stage ? `?stage=${enc(stage)}` : ""}`;
  const info = e.info || {};
  return [
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Experience ", h("code", {}, e.id)),
      h("span", { class: `status s-${e.status}` }, e.status),
      h("span", { class: "reward-big", title: "reward" }, `reward ${fmt(e.reward)}`),
    ),
    h(
      "div",
      { class: "facts" },
      [
        ["task", e.task_id],
        ["group", e.group_id],
        ["run id", e.run_id],
        ["kind", e.kind],
        ["explore step", e.batch ?? info.batch],
        ["step", e.step],
        ["policy version", e.policy_version],
        ["finish", e.finish_reason],
        ["prompt / response tokens", `${fmt(e.prompt_length)} / ${fmt(e.response_length)}`],
      ].map(([label, value]) =>
        h("div", { class: "fact" }, h("div", { class: "fact-label" }, label), h("div", { class: "fact-value" }, fmt(value))),
      ),
    ),
    rewardParts(e.reward_parts),
    h("h2", {}, "Tokens"),
    tokenView(data.tokens || [], data.advantage_note),
    turnsView(data.turns || []),
    h(
      "details",
      { class: "config" },
      h("summary", {}, "Text"),
      h(
        "div",
        { class: "text-pair" },
        h("h3", {}, "Prompt"),
        h("pre", { class: "code" }, data.prompt_text || ""),
        h("h3", {}, "Response"),
        h("pre", { class: "code" }, data.response_text || ""),
      ),
    ),
    h("details", { class: "config" }, h("summary", {}, "info (JSON)"), h("pre", { class: "code" }, JSON.stringify(info, null, 2))),
    groupView(data.group || [], e.id, link),
    stepsView(data.steps || [], e.id, link),
  ];
}

function rewardParts(parts) {
  if (!parts || !Object.keys(parts).length) return null;
  return h(
    "div",
    { class: "reward-parts" },
    h("span", { class: "muted" }, "reward parts: "),
    Object.entries(parts).map(([key, value]) => h("span", { class: "chip" }, `${key} `, h("strong", {}, fmt(value)))),
  );
}

/** The coloured token view with its toggle, legend and hover inspector. */
function tokenView(tokens, advantageNote) {
  if (!tokens.length) return h("p", { class: "muted" }, "This experience has no tokens stored.");
  const hasAdvantage = tokens.some((t) => t.advantage !== null && t.advantage !== undefined);
  const maxAbs = Math.max(1e-9, ...tokens.map((t) => Math.abs(t.advantage ?? 0)));
  const box = h("div", { class: "tokens", dataset: { mode: "logprob" } });
  const legend = h("div", { class: "legend" });
  const inspector = h("div", { class: "inspector muted" }, "Hover a token to see its id, logprob and advantage.");
  const spans = [];
  let segment = null;
  let kind = null;
  for (const [i, t] of tokens.entries()) {
    const tokenKind = t.prompt ? "prompt" : t.action ? "model" : "observation";
    if (tokenKind !== kind) {
      kind = tokenKind;
      segment = h("span", { class: `segment seg-${kind}` }, h("span", { class: "seg-label" }, kind));
      box.append(segment);
    }
    const span = h("span", { class: `tok tok-${kind}`, dataset: { i: String(i) } }, visible(t.text));
    spans.push([span, t, kind]);
    segment.append(span);
  }

  function paint(mode) {
    box.dataset.mode = mode;
    for (const [span, t, kind] of spans) {
      span.style.background = kind === "model" ? colour(mode, t, maxAbs) : "";
    }
    fill(legend, ...legendFor(mode, maxAbs));
  }

  box.addEventListener("mouseover", (event) => {
    const el = event.target.closest(".tok");
    if (!el) return;
    const t = tokens[Number(el.dataset.i)];
    const p = t.logprob === null || t.logprob === undefined ? null : Math.exp(t.logprob);
    const kind = t.prompt ? "prompt" : t.action ? "model" : "observation (not trained)";
    const probability = p === null ? "" : ` (p ${fmt(p)})`;
    inspector.textContent = `#${el.dataset.i} id ${t.id} ${JSON.stringify(t.text)} · ${kind} · logprob ${fmt(t.logprob)}${probability} · advantage ${fmt(t.advantage)}`;
  });
  const toggle = h(
    "div",
    { class: "toggle" },
    h("span", { class: "muted" }, "colour model tokens by "),
    ["logprob", "advantage"].map((mode) =>
      h(
        "label",
        {},
        h("input", {
          type: "radio",
          name: "colour",
          value: mode,
          checked: mode === "logprob",
          disabled: mode === "advantage" && !hasAdvantage,
          onchange: () => paint(mode),
        }),
        ` ${mode} `,
      ),
    ),
    !hasAdvantage && advantageNote ? h("span", { class: "muted small" }, `(advantage: ${advantageNote})`) : null,
  );
  paint("logprob");
  const note = hasAdvantage && advantageNote ? h("p", { class: "muted small" }, advantageNote) : null;
  return h("div", { class: "token-panel" }, toggle, legend, box, inspector, note);
}

/** Whitespace made visible: newlines as ↵ (and a line break), tabs as →. */
function visible(text) {
  if (text === "") return "∅";
  return text.replace(/\t/g, "→\t").replace(/\n/g, "↵\n");
}

function colour(mode, t, maxAbs) {
  if (mode === "logprob") {
    if (t.logprob === null || t.logprob === undefined) return "";
    const p = Math.exp(Math.min(0, t.logprob));
    return `hsl(${Math.round(120 * p)}, 75%, ${Math.round(78 + 10 * p)}%)`;
  }
  if (t.advantage === null || t.advantage === undefined) return "";
  const x = Math.max(-1, Math.min(1, t.advantage / maxAbs));
  return x >= 0 ? `hsl(140, 65%, ${Math.round(96 - 30 * x)}%)` : `hsl(0, 75%, ${Math.round(96 + 30 * x)}%)`;
}

function legendFor(mode, maxAbs) {
  const logprob = mode === "logprob";
  const stops = logprob
    ? [0, 0.25, 0.5, 0.75, 1].map((p) => colour("logprob", { logprob: Math.log(p || 1e-9) }))
    : [-1, -0.5, 0, 0.5, 1].map((x) => colour("advantage", { advantage: x * maxAbs }, maxAbs));
  const ends = logprob ? ["p = 0 (logprob −∞)", "p = 1 (logprob 0)"] : [`advantage −${fmt(maxAbs)}`, `+${fmt(maxAbs)}`];
  return [
    h("span", { class: "small" }, ends[0]),
    h("span", { class: "gradient", style: `background: linear-gradient(to right, ${stops.join(", ")})` }),
    h("span", { class: "small" }, ends[1]),
    h("span", { class: "tok tok-prompt small" }, "prompt"),
    h("span", { class: "segment seg-observation small" }, h("span", { class: "tok tok-observation" }, "observation")),
  ];
}

function turnsView(turns) {
  if (turns.length <= 2) return null;
  return h(
    "div",
    { class: "turns" },
    h("h2", {}, `Turns (${turns.length})`),
    turns.map((turn, i) =>
      h("div", { class: `turn turn-${turn.role}` }, h("div", { class: "turn-role" }, `${i + 1}. ${turn.role}`), h("pre", {}, turn.text)),
    ),
  );
}

function groupView(group, current, link) {
  if (!group.length) return null;
  const rewards = group.map((g) => g.reward).filter((r) => typeof r === "number");
  const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
  return h(
    "div",
    {},
    h("h2", {}, `Group (${group.length}, mean reward ${fmt(mean)})`),
    h(
      "table",
      { class: "grid compact group" },
      h("thead", {}, h("tr", {}, ["id", "reward", "status", "preview"].map((t) => h("th", {}, t)))),
      h(
        "tbody",
        {},
        group.map((g) =>
          h(
            "tr",
            { class: g.id === current ? "current" : "clickable", onclick: () => (location.hash = link(g.id)) },
            h("td", {}, h("a", { href: link(g.id) }, g.id)),
            h("td", { class: "num" }, fmt(g.reward)),
            h("td", {}, h("span", { class: `status s-${g.status}` }, g.status)),
            h("td", { class: "preview" }, g.preview || ""),
          ),
        ),
      ),
    ),
  );
}

function stepsView(steps, current, link) {
  if (steps.length <= 1) return null;
  return h(
    "div",
    {},
    h("h2", {}, `Steps of this trajectory (${steps.length})`),
    h(
      "ol",
      { class: "steps" },
      steps.map((s) =>
        h("li", { class: s.id === current ? "current" : "" }, h("a", { href: link(s.id) }, `step ${fmt(s.step)}`), ` reward ${fmt(s.reward)}`),
      ),
    ),
  );
}
