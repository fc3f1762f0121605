// panels3.js: inside execute_model: what an attention layer pulls from forward_context (article part 4), and,
// under tensor parallelism, what each rank held and exchanged (the terminal trace's "tensor parallel" lines).
"use strict";

// kv_cache of one layer, [2, num_blocks, block_size, num_kv_heads, head_size]: each dimension named.
const KV_DIMS = ["K and V", "num_blocks", "block_size", "num_kv_heads", "head_size"];

// Panel 4: execute_model wraps the forward in set_forward_context(attn_metadata, ..., slot_mapping); each
// attention layer calls get_attention_context(layer_name) and gets attn_metadata, itself (with its kv_cache)
// and slot_mapping back. Drawn as the first layer recorded them; every layer of the step shares attn_metadata.
function forwardContextPanel(model, s) {
  const a = s.execute && s.execute.attention;
  if (!a) {
    return panel("p-fwd", "Part 4", "forward_context",
                 el("p", {}, s.execute ? "not recorded in this trace" : "no forward this step"));
  }
  const b = s.execute.batch, bs = model.bs;
  const list = (v) => v === undefined ? "not recorded (an older trace)" : `[${v.join(", ")}]`;
  const field = (name, value, note) => el("tr", {"data-field": name, "data-value": JSON.stringify(value ?? null)},
    el("th", {}, name), el("td", {class: "text"}, Array.isArray(value) ? list(value) : value ?? list(undefined),
                           el("div", {class: "note"}, note)));
  const rows = (a.block_table || []).map((row, r) => el("tr", {class: "fwd-bt", "data-row": r, "data-req": b.req_ids[r]},
    el("th", {}, `block_table[${r}]`), el("td", {class: "text"}, "row ", r, ": ", chip(model, b.req_ids[r]), " ", list(row),
      r ? null : el("div", {class: "note"}, "indexed by batch row; entry k: the physical block of logical block k " +
                                            "(padded past the row's blocks)"))));
  const md = el("table", {class: "fwd"},
    field("num_actual_tokens", a.num_actual_tokens, "tokens in this forward"),
    field("max_query_len", a.max_query_len, "the longest request's new tokens"),
    field("max_seq_len", a.max_seq_len, "the longest history + new tokens"),
    field("query_start_loc", a.query_start_loc, "request i's rows: query_start_loc[i] .. [i + 1] - 1"),
    field("seq_lens", a.seq_lens, "per batch row: tokens in the KV cache after this step"),
    rows,
    field("slot_mapping", a.slot_mapping, "forward_context.slot_mapping[layer_name]: where each new token's K and V go"));
  return panel("p-fwd", "Part 4", "forward_context: what each attention layer pulls back",
    el("p", {}, el("code", {}, "with set_forward_context(attn_metadata, no_compile_layers, slot_mapping): " +
                               "model(input_ids, positions)"), el("br"),
       el("code", {}, `get_attention_context("${a.layer_name}")`),
       ` → attn_metadata, the layer, its kv_cache, slot_mapping (1 of ${a.num_layers ?? "?"} layers; all share ` +
       "attn_metadata)"),
    el("h3", {}, "attn_metadata"), md,
    el("h3", {}, "the layer's kv_cache"), kvCacheView(model, s, a));
}

// The layer's kv_cache: its shape, each dimension named, and the blocks this step writes, one cell per slot
// (offset in the block): written now by slot_mapping (the request's colour), holding an earlier token of a
// request in the batch (outlined), or not used by this batch.
function kvCacheView(model, s, a) {
  const b = s.execute.batch, bs = model.bs, slots = a.slot_mapping || b.slot_mapping;
  const shape = a.kv_cache_shape;
  const dims = shape.length === KV_DIMS.length ? shape.map((n, i) => `${KV_DIMS[i]} ${n}`).join(", ") : shape.join(", ");
  const writer = new Map(slots.map((slot, i) => [slot, i]));  // slot -> batch token writing it
  const earlier = new Map();  // slot -> request whose earlier token (already in the cache) it holds
  b.req_ids.forEach((id, r) => {
    const newTokens = b.query_start_loc[r + 1] - b.query_start_loc[r];
    for (let pos = 0; pos < b.seq_lens[r] - newTokens; pos++) {
      earlier.set(b.block_table[r][Math.floor(pos / bs)] * bs + (pos % bs), id);
    }
  });
  const blocks = [...new Set(slots.map((slot) => Math.floor(slot / bs)))].sort((x, y) => x - y);
  const rowOf = (i) => b.query_start_loc.findIndex((q, r) => i >= q && i < b.query_start_loc[r + 1]);
  const grid = blocks.map((blk) => el("div", {class: "kvrow", "data-block": blk},
    el("span", {class: "aname"}, `kv_cache[:, ${blk}]`),
    Array.from({length: bs}, (_, off) => {
      const slot = blk * bs + off, i = writer.get(slot), old = earlier.get(slot);
      const req = i !== undefined ? b.req_ids[rowOf(i)] : old;
      return el("span", {class: `cell kv ${i !== undefined ? "written" : old !== undefined ? "earlier" : "none"}`,
                         "data-slot": slot, "data-token": i ?? null, "data-req": req ?? null,
                         title: i !== undefined ? `slot ${slot} = block ${blk} * ${bs} + offset ${off}: written now by ` +
                                                  `batch token ${i} (request ${req}, position ${b.positions[i]})`
                           : old !== undefined ? `slot ${slot}: an earlier token of request ${old}, cached`
                           : `slot ${slot}: not used by this batch`,
                         style: i !== undefined ? {background: colourOf(model, req)}
                           : old !== undefined ? {borderColor: colourOf(model, old)} : {}}, off);
    })));
  return el("div", {class: "kvview", "data-shape": JSON.stringify(shape)},
    el("p", {}, el("code", {}, `kv_cache[${shape.join(", ")}]`), ` ${a.kv_cache_dtype ?? ""} (${dims}): this step ` +
       `writes K and V of ${slots.length} tokens at kv_cache[:, slot // ${bs}, slot % ${bs}], in ${blocks.length} ` +
       `block${blocks.length === 1 ? "" : "s"}:`),
    grid,
    el("p", {class: "note"}, "Filled: written this step (slot_mapping). Outlined: holds an earlier token of a request " +
                             "in this batch, read by attention through block_table. Numbers: the offset in the block."));
}

// Tensor parallelism, drawn for a run with more than one rank: each rank's shard (its slice of the heads, of
// the MLP, of the vocabulary), then the step's first all-reduces by their numbers and the logits' all-gather.
function ranksPanel(model, s) {
  const ranks = s.execute && s.execute.ranks;
  if (!ranks) return null;
  const span = ([lo, hi]) => hi - lo === 1 ? `${lo}` : `${lo}-${hi - 1}`;
  const nums = (v) => `[${v.map((x) => Number(x.toPrecision(4))).join(", ")}, ...]`;
  const rankRows = ranks.map((r) => el("tr", {"data-rank": r.rank},
    el("td", {}, `rank ${r.rank}`), el("td", {}, r.pid),
    el("td", {}, `${span(r.query_heads)} of ${r.total_num_heads}`), el("td", {}, `${span(r.kv_heads)} of ${r.total_num_kv_heads}`),
    el("td", {}, `[${r.qkv_proj_shape.join(", ")}]`),
    el("td", {}, `${r.mlp.layer} [${r.mlp.shape.join(", ")}]: units ${span(r.mlp.units)} of ${r.mlp.total_units}`),
    el("td", {}, `${span(r.vocab)} of ${r.vocab_size}`), el("td", {}, `[${r.kv_cache_shape.join(", ")}]`)));
  const first = ranks[0];
  const reduces = first.all_reduce.map((red, i) => el("li", {"data-op": "all_reduce"},
    `all-reduce ${red.layer ?? i} [${red.shape.join(", ")}]: `,
    ranks.map((r) => `rank ${r.rank} in ${nums(r.all_reduce[i].input)}`).join("; "), ` → every rank ${nums(red.output)}`));
  const gathers = first.all_gather.map((g) => el("li", {"data-op": "all_gather"},
    `all-gather ${g.layer ?? ""}: each rank's logits [${g.shape.join(", ")}] → [${g.output_shape.join(", ")}] on ` +
    "every rank, which all sample the same tokens"));
  return panel("p-ranks", "TP", `tensor parallel: ${ranks.length} ranks, one worker process each`,
    el("p", {}, "Rank 0 received this SchedulerOutput from the executor and broadcast it; every rank packed the same " +
                "batch and ran its shard:"),
    el("table", {class: "ranks"}, el("tr", {}, ["rank", "pid", "query heads", "KV heads", "qkv_proj", "MLP",
                                                "vocab ids", "kv_cache"].map((h) => el("th", {}, h))), rankRows),
    el("ul", {}, reduces, gathers),
    el("p", {class: "note"}, `${first.num_all_reduce} all-reduces this step on every rank (the embedding, then 2 ` +
                             "per layer); the first ones are shown by their first numbers."));
}
