// The dotted key path of a line of block-style YAML ("stages.1.trainer.lr"), from indentation alone:
// good enough for the config editor's field-doc panel (the server does the real parsing).

const KEY = /^(\s*)(-\s+)?(["']?)([A-Za-z_][\w.@/-]*)\3\s*:(\s|$)/;
const DASH = /^(\s*)-(\s|$)/;

/** {key, keyCol, dash, dashCol} for a line that holds a key, {dash, dashCol} for "- value", else null. */
export function parseLine(line) {
  if (!line.trim() || line.trim().startsWith("#")) return null;
  const m = line.match(KEY);
  if (m) {
    const dashCol = m[2] ? m[1].length : null;
    return { key: m[4], keyCol: m[1].length + (m[2] ? m[2].length : 0), dash: Boolean(m[2]), dashCol };
  }
  const d = line.match(DASH);
  if (d) return { key: null, keyCol: Infinity, dash: true, dashCol: d[1].length };
  return { key: null, keyCol: line.length - line.trimStart().length, dash: false, dashCol: null, value: true };
}

/** The key path at 0-based line `index` of `lines`; null when the line holds no key (nor does a parent). */
export function pathAt(lines, index) {
  let line = parseLine(lines[index] ?? "");
  while ((!line || !line.key) && index > 0) {
    // a blank line, a comment or a continued value: use the key above it
    index -= 1;
    line = parseLine(lines[index]);
  }
  if (!line || !line.key) return null;
  const parts = [line.key];
  let col = line.keyCol;
  let dashCol = line.dash ? line.dashCol : null;
  let position = 0;
  for (let j = index - 1; j >= 0; j--) {
    const p = parseLine(lines[j]);
    if (!p || p.value) continue;
    if (dashCol !== null) {
      if (p.dash && p.dashCol === dashCol) position += 1;
      else if (p.key && p.keyCol <= dashCol) {
        parts.unshift(p.key);
        parts.splice(1, 0, String(position));
        col = p.keyCol;
        dashCol = p.dash ? p.dashCol : null;
        position = 0;
      }
      continue;
    }
    if (p.dash && p.keyCol === col) {
      dashCol = p.dashCol;
      position = 0;
    } else if (p.key && p.keyCol < col) {
      parts.unshift(p.key);
      col = p.keyCol;
      if (p.dash) {
        dashCol = p.dashCol;
        position = 0;
      }
    }
  }
  return parts.join(".");
}

/** The schema entry for `path`: tried as is, without a leading "stages.N." and without list indices. */
export function lookup(fields, path) {
  if (!path) return null;
  const candidates = [path, path.replace(/^stages\.\d+\./, "")];
  for (const p of [...candidates]) {
    candidates.push(p.replace(/\.\d+(?=\.|$)/g, ""), p.replace(/\.\d+(?=\.|$)/g, "[]"), p.replace(/\.\d+(?=\.|$)/g, ".*"));
  }
  for (const candidate of candidates) if (fields[candidate]) return { path: candidate, ...fields[candidate] };
  return null;
}

/** The fields directly under `section` ("" for the top level) in the schema. */
export function childrenOf(fields, section) {
  const prefix = section ? `${section}.` : "";
  return Object.keys(fields).filter((p) => p.startsWith(prefix) && !p.slice(prefix.length).includes("."));
}
