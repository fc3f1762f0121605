// aliases.js: the short names the panels draw for long request ids (model.js gives every request one).
"use strict";

// A server's request ids are long ("cmpl-" and 32 hex digits): each panel draws a short alias instead, the
// first characters after the prefix (more where two would clash; an n > 1 child's "i_" kept), the full id
// on hover. Offline ids ("0", "1", ...) are short and drawn as they are.
const LONG_ID = 12;
function shortIds(ids) {
  const out = Object.fromEntries(ids.map((id) => [id, id]));
  const parts = ids.filter((id) => id.length > LONG_ID).map((id) => {
    const m = /^(\d+_)?(?:[A-Za-z]+-)?(.*)$/.exec(id);
    return [id, m[2], m[1] || ""];
  });
  const longest = Math.max(0, ...parts.map(([, core]) => core.length));
  for (let k = 4; k <= longest; k++) {
    const names = parts.map(([, core, child]) => child + (k < core.length ? core.slice(0, k) + "…" : core));
    const taken = new Set(ids.filter((id) => id.length <= LONG_ID));
    if (new Set(names).size === names.length && names.every((n) => !taken.has(n))) {
      parts.forEach(([id], i) => { out[id] = names[i]; });
      break;
    }
  }
  return out;  // no k gave unique names: the full ids
}
