// panels2.js: the panels after the scheduler: the packed batch (article part 3), the physical KV pool
// (part 5, with part 7's prefix cache) and sampling with reclamation (part 6).
"use strict";

// Panel 5: every array on the token dimension as coloured cells, one colour per request.
function batchPanel(model, s) {
  if (!s.execute) return panel("p-batch", "Part 3", "the packed batch", el("p", {}, "no forward this step"));
  const b = s.execute.batch;
  // token index -> row (request) in the batch, from query_start_loc: [0, 4, 9, 17] -> 0,0,0,0,1,...
  const rowOf = [];
  b.req_ids.forEach((_, r) => { for (let t = b.query_start_loc[r]; t < b.query_start_loc[r + 1]; t++) rowOf[t] = r; });
  const tokenRow = (name, values, rowFor) => el("div", {class: "arr", "data-name": name,
                                                        "data-values": JSON.stringify(values)},
    el("span", {class: "aname"}, name),
    values.map((v, i) => {
      const r = rowFor(i);
      return el("span", {class: r === null ? "cell none" : "cell", "data-i": i, "data-req": r === null ? null : b.req_ids[r], tabindex: 0,
                         style: {background: r === null ? "#ddd" : colourOf(model, b.req_ids[r])}}, v);
    }));
  const perReq = (r) => r < b.req_ids.length ? r : null;
  const box = el("div", {class: "formula", id: "slot-formula"},
                 "Point at a slot_mapping cell: slot = block_table[pos // block_size] * block_size + pos % block_size");
  const node = panel("p-batch", "Part 3", "flattening: the packed batch (slot_mapping: part 5)",
    tokenRow("input_ids", b.input_ids, (i) => rowOf[i]),
    tokenRow("positions", b.positions, (i) => rowOf[i]),
    tokenRow("slot_mapping", b.slot_mapping, (i) => rowOf[i]),
    tokenRow("num_scheduled_tokens", b.num_scheduled_tokens, perReq),
    tokenRow("query_start_loc", b.query_start_loc, perReq),
    tokenRow("seq_lens", b.seq_lens, perReq),
    tokenRow("logits_indices", b.logits_indices, (i) => rowOf[b.logits_indices[i]]),
    box);
  // The article's formula with this cell's numbers, on hover, focus or click.
  const explain = (cell) => {
    const i = Number(cell.dataset.i), r = rowOf[i], pos = b.positions[i], bs = model.bs;
    const row = b.block_table[r], phys = row[Math.floor(pos / bs)];
    box.textContent = `token ${i} of request ${b.req_ids[r]}: slot = block_table[${pos} // ${bs}] * ${bs} + ` +
                      `${pos} % ${bs} = ${phys} * ${bs} + ${pos % bs} = ${phys * bs + (pos % bs)}` +
                      `   (block_table[${b.req_ids[r]}] = [${row.join(", ")}], slot_mapping[${i}] = ${b.slot_mapping[i]})`;
    box.dataset.slot = String(phys * bs + (pos % bs));
    box.style.borderColor = colourOf(model, b.req_ids[r]);
  };
  node.querySelectorAll('.arr[data-name="slot_mapping"] .cell').forEach((cell) => {
    ["mouseenter", "focus", "click"].forEach((ev) => cell.addEventListener(ev, () => explain(cell)));
  });
  return node;
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
      : owners.length ? `block ${b}: ref_cnt ${owners.length}, owners ${owners.join(", ")}${pool.full[b] ? ", full: hashed, in the prefix cache" : ""}`
      : cachedFree !== undefined ? `block ${b}: free, still cached (full block of ${cachedFree}); evicted lazily when reused`
      : `block ${b}: free`;
    cells.push(el("div", {class: cls, "data-block": b, "data-owners": owners.join(","), "data-ref-cnt": owners.length,
                          "data-cached": pool.full[b] || cachedFree !== undefined ? "1" : "0", title: tip, style},
                  el("span", {class: "bid"}, b),
                  owners.length ? el("span", {class: "rc"}, `×${owners.length}`) : null,
                  pool.full[b] || cachedFree !== undefined ? el("span", {class: "hash"}, "#") : null));
  }
  const tables = Object.entries(pool.tables).map(([id, blocks]) =>
    el("div", {class: "btable", "data-req": id, "data-blocks": JSON.stringify(blocks)}, chip(model, id),
       " block_table = [", blocks.map((b, i) => el("span", {class: "bt", "data-block": b,
                                                            title: `logical ${i} -> physical ${b}`},
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
  reqIds.forEach((id, r) => {
    const sampled = s.execute ? s.execute.sampled[id] : undefined;
    const out = s.update ? s.update.outputs.find((o) => o.request_id === id) : null;
    const finish = out && out.finish_reason;
    rows.push(el("tr", {"data-req": id},
      el("td", {}, chip(model, id)),
      el("td", {}, b ? `row ${b.logits_indices[r]}` : ""),
      el("td", {"data-field": "sampled"}, sampled === undefined ? "— (prefill chunk: nothing sampled)" : sampled),
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
