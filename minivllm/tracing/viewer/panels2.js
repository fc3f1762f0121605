// panels2.js: the panels after the scheduler: the packed batch (article part 3), the physical KV pool
// (part 5, with part 7's prefix cache), sampling with reclamation (part 6) and, for a run with speculative
// decoding, the drafts each request carried, verified against the target model's tokens (part 6 too).
"use strict";

// Panel 5: every array on the token dimension as coloured cells, one colour per request.
function batchPanel(model, s) {
  if (!s.execute) return panel("p-batch", "Part 3", "the packed batch", el("p", {}, "no forward this step"));
  const b = s.execute.batch;
  // token index -> row (request) in the batch, from query_start_loc: [0, 4, 9, 17] -> 0,0,0,0,1,...
  const rowOf = [];
  b.req_ids.forEach((_, r) => { for (let t = b.query_start_loc[r]; t < b.query_start_loc[r + 1]; t++) rowOf[t] = r; });
  // A request carrying d drafts runs them as its last d tokens: those input_ids cells are drawn dashed.
  const numDrafts = (r) => (s.drafts[b.req_ids[r]] || []).length;
  const isDraft = (i) => rowOf[i] !== undefined && i >= b.query_start_loc[rowOf[i] + 1] - numDrafts(rowOf[i]);
  const tokenRow = (name, values, rowFor, drafts) => el("div", {class: "arr", "data-name": name,
                                                                "data-values": JSON.stringify(values)},
    el("span", {class: "aname"}, name),
    values.map((v, i) => {
      const r = rowFor(i), draft = drafts && isDraft(i);
      return el("span", {class: (r === null ? "cell none" : "cell") + (draft ? " draft" : ""), "data-i": i,
                         "data-req": r === null ? null : b.req_ids[r], tabindex: 0,
                         title: draft ? "a draft token" : null,
                         style: {background: r === null ? "#ddd" : colourOf(model, b.req_ids[r])}}, v);
    }));
  const perReq = (r) => r < b.req_ids.length ? r : null;
  const box = el("div", {class: "formula", id: "slot-formula"},
                 "Point at a slot_mapping cell: slot = block_table[pos // block_size] * block_size + pos % block_size");
  const node = panel("p-batch", "Part 3", "flattening: the packed batch (slot_mapping: part 5)",
    tokenRow("input_ids", b.input_ids, (i) => rowOf[i], true),
    tokenRow("positions", b.positions, (i) => rowOf[i]),
    tokenRow("slot_mapping", b.slot_mapping, (i) => rowOf[i]),
    tokenRow("num_scheduled_tokens", b.num_scheduled_tokens, perReq),
    tokenRow("query_start_loc", b.query_start_loc, perReq),
    tokenRow("seq_lens", b.seq_lens, perReq),
    tokenRow("logits_indices", b.logits_indices, (i) => rowOf[b.logits_indices[i]]),
    blockTableRows(model, b), box);
  // The article's formula with this cell's numbers, on hover, focus or click. Four kinds of index meet here,
  // each named: the token's index in the packed batch, its request's batch row, its position in the request,
  // and the logical block (pos // block_size) that the row of block_table maps to a physical block.
  const explain = (cell) => {
    const i = Number(cell.dataset.i), r = rowOf[i], pos = b.positions[i], bs = model.bs;
    const row = b.block_table[r], logical = Math.floor(pos / bs), phys = row[logical];
    box.replaceChildren(
      el("div", {}, `batch token ${i} (index into the packed batch) · batch row ${r} = request `,
         chip(model, b.req_ids[r]), ` · position ${pos} (index in the request's tokens)`),
      el("div", {}, `logical block ${pos} // ${bs} = ${logical} · physical block block_table[row ${r}][${logical}] = ` +
                    `${phys} · offset ${pos} % ${bs} = ${pos % bs}`),
      el("div", {}, `slot = block_table[pos // block_size] * block_size + pos % block_size = ` +
                    `block_table[${pos} // ${bs}] * ${bs} + ${pos} % ${bs} = ${phys} * ${bs} + ${pos % bs} = ` +
                    `${phys * bs + (pos % bs)} (slot_mapping[${i}] = ${b.slot_mapping[i]})`));
    box.dataset.slot = String(phys * bs + (pos % bs));
    box.style.borderColor = colourOf(model, b.req_ids[r]);
  };
  node.querySelectorAll('.arr[data-name="slot_mapping"] .cell').forEach((cell) => {
    ["mouseenter", "focus", "click"].forEach((ev) => cell.addEventListener(ev, () => explain(cell)));
  });
  return node;
}

// block_table, one row per batch row (indexed by row, not by request id: row r is req_ids[r]), each entry
// logical -> physical block; entries past the row's ceil(seq_len / block_size) blocks are the array's padding.
function blockTableRows(model, b) {
  return el("div", {class: "btrows"}, b.block_table.map((row, r) => {
    const used = Math.ceil(b.seq_lens[r] / model.bs);
    return el("div", {class: "btrow", "data-row": r, "data-req": b.req_ids[r], "data-blocks": JSON.stringify(row)},
      el("span", {class: "aname"}, `block_table[${r}]`),
      el("span", {class: "rowof"}, "row ", r, ": ", chip(model, b.req_ids[r])),
      row.map((p, k) => k < used
        ? el("span", {class: "cell", title: `batch row ${r} (request ${b.req_ids[r]}): logical block ${k} -> ` +
                                            `physical block ${p}`, style: {background: colourOf(model, b.req_ids[r])}},
             `${k}→${p}`)
        : el("span", {class: "cell none", title: "padding: the row has no block here"}, "·")));
  }));
}

// Panel 6: the physical KV pool, one square per block, coloured by owner; each scheduled block table drawn on it.
function poolPanel(model, s) {
  const n = model.info.num_gpu_blocks, pool = s.pool;
  // Blocks past the highest id this run ever used are free and never touched: drawn as one count.
  const shown = Math.min(n, Math.ceil((model.lastUsed + 1) / 16) * 16);
  const cells = [];
  for (let b = 0; b < shown; b++) {
    const owners = pool.owners[b] || [];
    const cachedFree = pool.freeCached[b];
    const cls = b === 0 ? "blk reserved" : owners.length ? "blk used" : cachedFree !== undefined ? "blk cached" : "blk free";
    const style = owners.length === 1 ? {background: colourOf(model, owners[0])}
      : owners.length > 1 ? {background: `linear-gradient(135deg, ${owners.map((o) => colourOf(model, o)).join(", ")})`}
      : cachedFree !== undefined ? {borderColor: colourOf(model, cachedFree)} : {};
    const tip = b === 0 ? "block 0: reserved (the null block)"
      : owners.length ? `block ${b}: ref_cnt ${owners.length}, owners ${owners.map((o) => nameOf(model, o)).join(", ")}${pool.full[b] ? ", full: hashed, in the prefix cache" : ""}`
      : cachedFree !== undefined ? `block ${b}: free, still cached (full block of ${nameOf(model, cachedFree)}); evicted lazily when reused`
      : `block ${b}: free`;
    cells.push(el("div", {class: cls, "data-block": b, "data-owners": owners.join(","), "data-ref-cnt": owners.length,
                          "data-cached": pool.full[b] || cachedFree !== undefined ? "1" : "0", title: tip, style},
                  el("span", {class: "bid"}, b),
                  owners.length ? el("span", {class: "rc"}, `×${owners.length}`) : null,
                  pool.full[b] || cachedFree !== undefined ? el("span", {class: "hash"}, "#") : null));
  }
  const batchRow = (id) => s.execute ? s.execute.batch.req_ids.indexOf(id) : -1;
  const tables = Object.entries(pool.tables).map(([id, blocks]) =>
    el("div", {class: "btable", "data-req": id, "data-blocks": JSON.stringify(blocks)}, chip(model, id),
       batchRow(id) >= 0 ? ` batch row ${batchRow(id)}: block_table[${batchRow(id)}] = [` : " (not in this batch) blocks = [", blocks.map((b, i) => el("span", {class: "bt", "data-block": b,
                                                            title: `request ${id}: logical block ${i} -> physical block ${b}`},
                                                    `${i}→${b}`)).reduce((a, x) => a.concat(a.length ? [", ", x] : [x]), []),
       "]"));
  const node = panel("p-pool", "Part 5", "paged KV cache: the physical block pool (prefix caching: part 7)",
    el("div", {class: "grid", "data-num-blocks": n, "data-shown": shown, "data-num-free": s.after.numFree}, cells),
    el("p", {class: "note"}, `${n} blocks of ${model.bs} tokens; block 0 reserved. ` +
       (shown < n ? `Blocks ${shown}..${n - 1} were never used in this run: free, not drawn. ` : "") +
       `Free after schedule(): ${s.after.numFree}. ×k = ref_cnt (live block tables holding the block); ` +
       `# = full block, hashed in the prefix cache (counted from num_computed_tokens; the hash value and the free ` +
       `queue's order are not in the trace).`),
    el("div", {class: "btables"}, tables));
  // Pointing at a block-table entry lights its block in the grid.
  node.querySelectorAll(".bt").forEach((bt) => bt.addEventListener("mouseenter", () => {
    node.querySelectorAll(".blk.lit").forEach((x) => x.classList.remove("lit"));
    const blk = node.querySelector(`.blk[data-block="${bt.dataset.block}"]`);
    if (blk) blk.classList.add("lit");
  }));
  return node;
}

// Panel 7: logits_indices -> sampled token -> text so far; finish reasons and the blocks returned.
function samplingPanel(model, s) {
  const rows = [];
  const b = s.execute && s.execute.batch;
  const reqIds = b ? b.req_ids : Object.keys(s.schedule.num_scheduled_tokens);
  reqIds.forEach((id) => {
    const sampled = s.execute ? s.execute.sampled[id] : undefined;
    const out = s.update ? s.update.outputs.find((o) => o.request_id === id) : null;
    const finish = out && out.finish_reason;
    const at = s.logitsRows[id] || [], v = s.verify.find((x) => x.req === id && x.kept);
    rows.push(el("tr", {"data-req": id},
      el("td", {}, chip(model, id)),
      el("td", {}, at.length > 1 ? `rows ${at[0]}..${at[at.length - 1]}` : at.length ? `row ${at[0]}` : ""),
      v ? el("td", {"data-field": "sampled", "data-tokens": JSON.stringify(v.kept)},
             `${v.kept.join(", ")} (drafts verified: see speculative decoding)`)
        : el("td", {"data-field": "sampled"}, sampled === undefined ? "— (prefill chunk: nothing sampled)" : sampled),
      el("td", {class: "text"}, s.texts[id] === undefined ? "" : JSON.stringify(s.texts[id])),
      el("td", {}, finish ? `${finish}${out.stop_reason !== null ? ` (${JSON.stringify(out.stop_reason)})` : ""}; ` +
                            `blocks [${(s.update.freed[id] || []).join(", ")}] returned` : "")));
  });
  return panel("p-sample", "Part 6", "logits, sampling, update, reclamation",
    el("table", {}, el("tr", {}, ["req", "logits_indices", "sampled token id", "text so far", "finished"]
                                   .map((h) => el("th", {}, h))), rows),
    s.afterUpdate ? el("p", {}, `after update_from_output(): free blocks ${s.afterUpdate.numFree}; `,
                       queue(model, "waiting-updated", s.afterUpdate.waiting),
                       queue(model, "running-updated", s.afterUpdate.running)) : null);
}

// Panel 8, drawn only for a run with speculative decoding: per request that carried drafts this step, the drafts
// against the target model's tokens at the same positions, what was kept, and the rollback of num_computed_tokens.
function specPanel(model, s) {
  if (!model.speculative) return null;
  const cell = (cls, attrs, text, tip) => el("td", Object.assign({class: `tok ${cls}`, title: tip}, attrs), text);
  const requests = s.verify.map((v) => {
    const d = v.drafts.length, a = v.accepted, verified = v.rejected !== null;
    const first = v.from - d;  // the position of the first draft
    const target = verified ? v.kept[v.kept.length - 1] : null;
    const drafts = v.drafts.map((t, k) => {
      const status = !verified ? "unverified" : k < a ? "accepted" : "rejected";
      return cell(status, {"data-token": t, "data-status": status},
                  `${t}${status === "accepted" ? " ✓" : status === "rejected" ? " ✗" : ""}`,
                  status === "accepted" ? "accepted: the target model chose the same token"
                    : status === "rejected" ? (k === a ? "rejected: the target model chose another token"
                                                       : "rejected: after the first mismatch the rest are discarded")
                    : "verification not recorded");
    });
    const targets = v.drafts.map((t, k) => !verified ? cell("none", {}, "?")
      : k < a ? cell("same", {"data-token": t}, t, "the target's token: the draft's")
      : k === a ? cell("target", {"data-token": target}, `${target} ←`,
                       "the target's token, kept in place of the draft")
      : cell("none", {}, "·", "not compared"));
    const bonus = verified && a === d;
    const rows = v.rows.length ? `batch rows ${v.rows[0]}..${v.rows[v.rows.length - 1]} ` : "";
    const before = s.textsBefore[v.req], after = s.outputs ? s.texts[v.req] : undefined;
    const added = before !== undefined && after !== undefined && after.startsWith(before)
      ? after.slice(before.length) : null;  // what the caller's detokenizer appended for the kept tokens
    return el("div", {class: "verify", "data-req": v.req, "data-drafts": JSON.stringify(v.drafts),
                      "data-kept": verified ? JSON.stringify(v.kept) : null, "data-accepted": a,
                      "data-rejected": v.rejected, "data-target": target,
                      "data-bonus": verified ? String(bonus) : null},
      el("p", {}, chip(model, v.req), d === 1 ? ` 1 draft at position ${first}, verified by ${rows}(its last sampled ` +
                                                `token, then the draft)`
                                              : ` ${d} drafts at positions ${first}..${v.from - 1}, verified by ` +
                                                `${rows}(its last sampled token, then the drafts)`),
      el("table", {class: "vtable"},
         el("tr", {}, el("th", {}, "position"), v.drafts.map((_, k) => el("th", {}, first + k)), el("th", {}, v.from)),
         el("tr", {}, el("th", {}, "draft"), drafts, el("td", {class: "tok none"}, "")),
         el("tr", {}, el("th", {}, "target"), targets,
            bonus ? cell("target bonus", {"data-token": target}, `${target} bonus`,
                         "every draft matched: the last row's token")
                  : cell("none", {}, ""))),
      el("p", {},
         verified ? `accepted ${a} of ${d}, rejected ${v.rejected}; kept [${v.kept.join(", ")}]: ` +
                    (bonus ? `the drafts, then the bonus token ${target}` : `${a ? "the accepted drafts, then " : ""}` +
                     `the target's ${target} in place of draft ${v.drafts[a]}`) +
                    (added === null ? "" : `; the text grows by ${JSON.stringify(added)}`)
                  : "the verification of these drafts is not recorded", el("br"),
         verified ? el("span", {"data-field": "rollback", "data-from": v.from, "data-to": v.to},
                       `num_computed_tokens ${v.from} -> ${v.to} (rolled back ${v.rejected})`) : null));
  });
  return panel("p-spec", "Part 6", "speculative decoding: drafts, verification, rollback",
    requests.length ? requests : el("p", {class: "empty"}, "no request carried drafts this step"),
    el("p", {class: "note"}, "A request with d drafts runs d + 1 rows. Row j's logits give the target model's " +
       "token for the position after row j, so the drafts are checked in order: the first mismatch is replaced by " +
       "the target's token and every later draft is discarded; if all match, the last row adds a bonus token. " +
       "The drafts counted as computed when scheduled; update_from_output subtracts the rejected ones from " +
       "num_computed_tokens (their KV slots are written over later). Token ids: the trace records no text per token."));
}
