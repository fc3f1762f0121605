// model.js: turn the recorded trace (the JSON `python -m minivllm trace --json` writes) into one state per
// engine step, the state every panel draws. Nothing here invents a number: each field is a recorded value or
// is counted from recorded values (the derivations are named where they happen), and a value the trace does
// not record stays null so that the panel says so.
"use strict";

// The kinds of event marked on the step slider, in the order of a request's life. A rejection (drafts the
// target model did not confirm) happens only with speculative decoding: its row is drawn only for such a run.
const EVENT_KINDS = ["admission", "prefix hit", "preemption", "resume", "lazy eviction", "rejection", "finish"];
const SPEC_KINDS = ["rejection"];

function buildModel(data) {
  const trace = data.trace, info = trace.info, config = data.config || {};
  const bs = info.block_size;
  const reqs = {};            // request id -> {id, colour, prompt, promptLen, maxTokens}
  const owned = new Map();    // request id -> its block ids, as of the last schedule()
  const freeCached = new Map(); // block id -> request whose full (hashed) block it was; free, still cached
  const numTokens = {};       // request id -> prompt tokens + tokens sampled so far (request.num_tokens)
  const computed = {};        // request id -> num_computed_tokens once the last schedule() is applied
  const cachedLen = {};       // request id -> tokens whose full blocks its last allocate_slots cached
  const texts = {};           // request id -> text so far, as the caller detokenized it
  const finishedAt = {};      // request id -> {step, reason}
  const steps = [];
  let queues = {waiting: [], running: []}; // the last recorded WAITING and RUNNING
  // Async scheduling: step N + 1 is scheduled before step N's execute and update events arrive, so those are
  // matched to their step by number, and the caller's outputs to the step last updated.
  let cur = null, done = null;
  const byN = new Map();      // step number -> step
  // Every request id in the trace, first seen first, and its alias for the panels (A(id)).
  const seen = new Set();
  for (const e of trace.events) {
    [e.request_id, ...(e.request_ids || []), ...Object.keys(e.num_scheduled_tokens || {})]
      .forEach((id) => id !== undefined && seen.add(id));
  }
  const aliases = shortIds([...seen]);
  const A = (id) => aliases[id] ?? id;

  const register = (id) => reqs[id] || (reqs[id] = {id, alias: A(id), colour: Object.keys(reqs).length});
  // With prefix caching on, a full block of a request carries a hash (allocate_slots caches the full blocks
  // of min(num_computed_tokens + num_new_tokens, num_tokens), never fewer than it had); freed, it stays cached
  // until reused. The count is taken at schedule(): drafts raise num_computed_tokens past num_tokens, and the
  // tokens update_from_output appends are cached only by the next allocate_slots.
  const caching = config.enable_prefix_caching !== false;
  const fullBlocks = (id) => Math.floor((cachedLen[id] || 0) / bs);
  const release = (id) => {  // a preempted, finished or aborted request gives back its blocks
    const blocks = owned.get(id) || [];
    if (caching) blocks.slice(0, fullBlocks(id)).forEach((b) => freeCached.set(b, id));
    owned.delete(id);
    delete cachedLen[id];
    return blocks;
  };
  let speculative = false;    // did any step carry drafts (speculative decoding)?

  for (const e of trace.events) {
    if (e.kind === "submit") {
      Object.assign(register(e.request_id), {prompt: e.prompt, promptLen: e.prompt_token_ids.length,
                                            maxTokens: e.max_tokens});
      numTokens[e.request_id] = e.prompt_token_ids.length;
    } else if (e.kind === "arrival") {
      register(e.request_id).promptLen = e.num_prompt_tokens;
      numTokens[e.request_id] = e.num_prompt_tokens;
      queues = {waiting: e.waiting.slice(), running: queues.running};
    } else if (e.kind === "schedule") {
      cur = scheduleStep(e);
      steps.push(cur);
      byN.set(cur.n, cur);
    } else if (e.kind === "execute" && cur) {
      const at = byN.get(e.step) || cur;
      at.execute = e;
      at.logitsRows = logitsRows(e.batch);
    } else if (e.kind === "update" && cur) {
      const at = done = byN.get(e.step) || cur;
      at.update = e;
      at.verify = verification(at, e.spec_decode || {});
      if (at.verify.length) speculative = true;
      for (const v of at.verify) {
        if (v.rejected === null) continue;
        computed[v.req] = v.to;  // update_from_output rolls num_computed_tokens back over the rejected drafts
        if (v.rejected > 0) {
          at.events.push({kind: "rejection", req: v.req,
                          text: `${A(v.req)} verified ${v.drafts.length} draft${v.drafts.length === 1 ? "" : "s"}: ` +
                                `${v.accepted} accepted, ${v.rejected} rejected; num_computed_tokens ${v.from} -> ` +
                                `${v.to} (rolled back ${v.rejected})`});
        }
      }
      for (const o of e.outputs) {
        numTokens[o.request_id] += o.new_token_ids.length;
        if (o.finish_reason) {
          finishedAt[o.request_id] = {step: e.step, reason: o.finish_reason};
          release(o.request_id);
          at.events.push({kind: "finish", req: o.request_id,
                          text: `${A(o.request_id)} finished (${o.finish_reason}); blocks [${(e.freed[o.request_id] || []).join(", ")}] returned`});
        }
      }
      queues = {waiting: e.waiting.slice(), running: e.running.slice()};
      at.afterUpdate = {waiting: queues.waiting, running: queues.running, numFree: e.num_free_blocks};
    } else if (e.kind === "outputs" && cur) {
      const at = done || cur;  // the caller's outputs of the step last updated
      at.outputs = e;
      for (const o of e.outputs) texts[o.request_id] = o.text;
      at.texts = Object.assign({}, texts);
    } else if (e.kind === "window") {  // the live page's window: token counts as of its first step
      Object.assign(numTokens, e.num_tokens);
    } else if (e.kind === "abort") {
      e.request_ids.forEach(release);
    }
  }

  // One step's schedule(): the queues before and after, the budget's spending, and the pool once applied.
  function scheduleStep(e) {
    const step = {n: e.step, schedule: e, execute: null, update: null, outputs: null, events: [],
                  before: {waiting: queues.waiting, running: queues.running},
                  after: {waiting: e.waiting.slice(), running: e.running.slice(), numFree: e.num_free_blocks},
                  texts: Object.assign({}, texts), textsBefore: Object.assign({}, texts),
                  drafts: e.scheduled_spec_decode_tokens || {}, verify: [], logitsRows: {}};
    if (Object.keys(step.drafts).length) speculative = true;
    const nst = e.num_scheduled_tokens, cached = e.scheduled_cached_reqs;
    Object.keys(nst).forEach(register);  // live: a request already running when the page opened
    // Token budget. RUNNING requests are served first (cached, not resumed); new and resumed requests come
    // from WAITING with what is left. A request got fewer tokens than it still needed: the chunk clamp.
    const budget = {limit: config.max_num_batched_tokens ?? null, running: [], waiting: [],
                    total: e.total_num_scheduled_tokens};
    const want = (id, start) => (numTokens[id] || 0) - start;
    cached.req_ids.forEach((id, i) => {
      const row = {req: id, n: nst[id], need: want(id, cached.num_computed_tokens[i]),
                   resumed: cached.resumed_from_preemption[i]};
      (row.resumed ? budget.waiting : budget.running).push(row);
      computed[id] = cached.num_computed_tokens[i] + nst[id];
    });
    for (const r of e.scheduled_new_reqs) {
      budget.waiting.push({req: r.req_id, n: nst[r.req_id], need: want(r.req_id, r.num_computed_tokens),
                           hit: r.num_computed_tokens});
      computed[r.req_id] = r.num_computed_tokens + nst[r.req_id];
    }
    step.budget = budget;
    step.start = Object.fromEntries([...cached.req_ids.map((id, i) => [id, cached.num_computed_tokens[i]]),
                                     ...e.scheduled_new_reqs.map((r) => [r.req_id, r.num_computed_tokens])]);
    for (const id of Object.keys(nst)) {
      cachedLen[id] = Math.max(cachedLen[id] || 0, Math.min(computed[id], numTokens[id] || 0));
    }

    // The pool. Preempted requests free their blocks; every scheduled request's block table is recorded.
    for (const id of e.preempted_req_ids) {
      const freed = release(id);
      step.events.push({kind: "preemption", req: id,
                        text: `${A(id)} preempted: blocks [${freed.join(", ")}] freed, num_computed_tokens=0, prepended to WAITING`});
    }
    const hitBlocks = new Set();
    for (const r of e.scheduled_new_reqs) {
      const hits = r.block_ids.slice(0, Math.floor(r.num_computed_tokens / bs));
      hits.forEach((b) => hitBlocks.add(b));
      step.events.push({kind: "admission", req: r.req_id,
                        text: `${A(r.req_id)} admitted from WAITING: ${nst[r.req_id]} of ${r.num_prompt_tokens} prompt tokens`});
      if (hits.length) {
        step.events.push({kind: "prefix hit", req: r.req_id,
                          text: `${A(r.req_id)} prefix-cache hit: ${r.num_computed_tokens} tokens, blocks [${hits.join(", ")}]`});
      }
    }
    cached.req_ids.forEach((id, i) => {
      if (!cached.resumed_from_preemption[i]) return;
      const nc = cached.num_computed_tokens[i], hits = e.block_tables[id].slice(0, Math.floor(nc / bs));
      step.events.push({kind: "resume", req: id,
                        text: `${A(id)} resumed: ` + (nc ? `its first ${nc} tokens are a prefix-cache hit, so it ` : "") +
                              `recomputes ${nst[id]} tokens from num_computed_tokens=${nc}`});
      if (hits.length) {  // a resumed request looks up the prefix cache too, and may find its own old blocks
        hits.forEach((b) => hitBlocks.add(b));
        step.events.push({kind: "prefix hit", req: id,
                          text: `${A(id)} prefix-cache hit on resume: ${nc} tokens, blocks [${hits.join(", ")}]`});
      }
    });
    for (const [id, blocks] of Object.entries(e.block_tables)) {
      for (const b of blocks) {
        // A free block that still held a hash, handed to a request that did not hit it: lazily evicted.
        if (freeCached.has(b) && !hitBlocks.has(b) && !(owned.get(id) || []).includes(b)) {
          step.events.push({kind: "lazy eviction", req: id,
                            text: `block ${b} (cached, from ${A(freeCached.get(b))}) evicted and reused by ${A(id)}`});
        }
        freeCached.delete(b);
      }
      owned.set(id, blocks.slice());
    }
    step.pool = poolState();
    return step;
  }

  // Speculative decoding, per request that carried drafts: what the rejection sampler kept and the rollback.
  // Its d + 1 rows (its last sampled token, then the drafts) count as computed once scheduled: num_computed_tokens
  // `from` = start + num_scheduled_tokens; update_from_output subtracts the rejected drafts: `to` = from - rejected.
  // Draft k sits at position from - d + k; the target's token there came from the row before it; the token kept
  // last (a bonus if every draft matched, else the target's in place of the first mismatch) sits at `to`.
  // rejected === null: the trace records the drafts but not their verification (an older trace).
  function verification(step, spec) {
    const nst = step.schedule.num_scheduled_tokens;
    const ids = [...new Set([...Object.keys(step.drafts), ...Object.keys(spec)])];
    return ids.map((id) => {
      const v = spec[id], drafts = step.drafts[id] || v.draft_token_ids;
      const from = (step.start[id] ?? 0) + (nst[id] ?? 0);
      return {req: id, drafts, from, kept: v ? v.sampled_token_ids : null, accepted: v ? v.num_accepted : null,
              rejected: v ? v.num_rejected : null, to: v ? from - v.num_rejected : null,
              rows: step.logitsRows[id] || []};
    });
  }

  // Who owns each block right after schedule(); ref_cnt counts the owners (block tables of live requests).
  function poolState() {
    const owners = {}, full = {};
    for (const [id, blocks] of owned) {
      const nFull = caching ? fullBlocks(id) : 0;
      blocks.forEach((b, i) => {
        (owners[b] = owners[b] || []).push(id);
        if (i < nFull) full[b] = true;
      });
    }
    return {owners, full, freeCached: Object.fromEntries(freeCached),
            tables: Object.fromEntries([...owned].map(([id, blocks]) => [id, blocks.slice()]))};
  }

  const lastUsed = Math.max(0, ...steps.flatMap((s) => Object.keys(s.pool.owners).map(Number)));
  return {info, config, bs, reqs, steps, finishedAt, lastUsed, speculative, callerPid: trace.caller_pid,
          multiprocess: info.pid !== trace.caller_pid, alias: A};
}

// The batch rows whose logits each request samples from: its last row, or its last d + 1 when it carries d
// drafts; none for a partial prefill chunk. Request i owns rows query_start_loc[i] .. query_start_loc[i + 1] - 1.
function logitsRows(batch) {
  const qsl = batch.query_start_loc;
  return Object.fromEntries(batch.req_ids.map((id, i) =>
    [id, batch.logits_indices.filter((r) => r >= qsl[i] && r < qsl[i + 1])]));
}
