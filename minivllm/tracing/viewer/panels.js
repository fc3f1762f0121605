// panels.js: draw one engine step into the seven panels (an eighth, for speculative decoding, in panels2.js).
// Each panel is titled with the article part it illustrates; every value comes from the step built by model.js.
// Cells carry data- attributes (data-req, data-ids, data-values, data-owners, data-ref-cnt, data-drafts) so a
// test reads back exactly what is drawn.
"use strict";

// One colour per request, the same in every panel: a high-contrast palette that stays apart on a projector.
const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324",
                 "#808000", "#000075"];
const colourOf = (model, id) => PALETTE[(model.reqs[id] ? model.reqs[id].colour : 0) % PALETTE.length];

// el("div", {class: "x", "data-req": "0"}, child, "text", ...): a DOM element; null children are skipped.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "style") Object.assign(node.style, v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

// A request's chip: its id (a server's long id: its alias, the full id on hover) on its colour.
const nameOf = (model, id) => model.alias ? model.alias(id) : id;
const chip = (model, id, extra) => el("span", {class: "chip", "data-req": id, title: id,
                                             style: {background: colourOf(model, id)}},
                                      extra ? `${nameOf(model, id)} ${extra}` : nameOf(model, id));

function panel(id, part, title, ...body) {
  return el("section", {class: "panel", id},
            el("h2", {}, el("span", {class: "part"}, part), " ", title), ...body);
}

// A queue drawn as chips, head first; data-ids holds the ids in order.
function queue(model, name, ids) {
  return el("div", {class: "queue", "data-queue": name, "data-ids": JSON.stringify(ids)},
            el("span", {class: "qname"}, name.split("-")[0].toUpperCase()),
            ids.length ? ids.map((id) => chip(model, id)) : el("span", {class: "empty"}, "empty"));
}

// Panel 1: which process ran each stage of EngineCore.step(); with async scheduling, how two steps overlap
// (overlap.js).
function stagesPanel(model, s) {
  const where = (e) => e ? `${e.process} (pid ${e.pid})` : "not recorded";
  const boundary = model.multiprocess ? "EngineCore ran in a child process; its events crossed the IPC queue"
                                      : "EngineCore ran in the caller's process (in-process client)";
  const stage = (name, e, what) => el("div", {class: "stage", "data-stage": name},
                                      el("code", {}, name), el("div", {class: "who"}, where(e)), el("div", {}, what));
  return panel("p-stages", "Part 1", "generate() and the process boundary: one EngineCore.step()",
    el("div", {class: "stages"},
       stage("schedule()", s.schedule, `${s.schedule.total_num_scheduled_tokens} tokens scheduled`),
       el("span", {class: "arrow"}, "→"),
       stage("execute_model()", s.execute, s.execute ? `${s.execute.batch.input_ids.length} tokens in one forward`
                                                     : "no forward this step"),
       el("span", {class: "arrow"}, "→"),
       stage("update_from_output()", s.update, s.update ? `${s.update.outputs.length} EngineCoreOutputs` : ""),
       el("span", {class: "arrow"}, "⇒"),
       stage("LLMEngine.step(): output processing", s.outputs, s.outputs ? "detokenize, RequestOutputs" : "")),
    el("p", {class: "note"}, boundary), asyncView(model, s));
}

// Panel 2: the queues just before and right after schedule().
function queuesPanel(model, s) {
  return panel("p-queues", "Part 2", "schedule(): WAITING and RUNNING",
    el("div", {class: "cols"},
       el("div", {}, el("h3", {}, "before schedule()"), queue(model, "waiting-before", s.before.waiting),
          queue(model, "running-before", s.before.running)),
       el("div", {}, el("h3", {}, "after schedule()"), queue(model, "waiting-after", s.after.waiting),
          queue(model, "running-after", s.after.running))),
    el("p", {class: "note"}, `WAITING is drawn head first (the next one admitted). Free blocks after schedule(): ` +
                             `${s.after.numFree}.`));
}

// Panel 3: the token budget as a bar drawn to scale (a segment's width is its tokens over max_num_batched_tokens),
// RUNNING pass then WAITING pass, clamped chunks marked, then what is left. A step that spends under a tenth of
// the budget (a decode step: 3 of 8192, a sliver) is drawn a second time magnified: the bar below it stands for
// the first `span` tokens of the budget only, a power of two at least 4x what the step spent, and says so.
const MAGNIFY_BELOW = 0.1;
function budgetPanel(model, s) {
  const b = s.budget, limit = b.limit;
  const left = limit === null ? null : limit - b.total;
  const rows = [...b.running.map((r) => [r, "running"]), ...b.waiting.map((r) => [r, "waiting"])];
  const seg = (row, pass, span) => el("div", {class: "seg" + (row.n < row.need ? " clamped" : ""), "data-req": row.req,
                                             "data-pass": pass, "data-n": row.n,
                                             style: {width: `${(100 * row.n) / span}%`, background: colourOf(model, row.req)},
                                             title: `${row.req}: ${row.n} of ${row.need} tokens it needed`},
                                      `${nameOf(model, row.req)}:${row.n}`);
  // span: the tokens the bar's full width stands for; the rest of it drawn light, labelled
  const bar = (kind, span, rest) => el("div", {class: "bar", "data-bar": kind, "data-span": span, "data-limit": limit,
                                               "data-total": b.total},
    rows.map(([row, pass]) => seg(row, pass, span)),
    span > b.total ? el("div", {class: "seg left", "data-n": span - b.total,
                                style: {width: `${(100 * (span - b.total)) / span}%`}}, rest) : null);
  const scale = limit ?? Math.max(b.total, 1);  // budget not recorded: the bar is the step's own tokens
  let span = 4;
  while (span < 4 * b.total) span *= 2;
  const magnify = limit !== null && b.total / limit < MAGNIFY_BELOW && span < limit;
  const factor = magnify ? limit / span : 1;
  const sum = (list) => list.reduce((a, r) => a + r.n, 0);
  const clamps = [...b.running, ...b.waiting].filter((r) => r.n < r.need)
    .map((r) => el("li", {"data-req": r.req}, chip(model, r.req), ` chunk: ${r.n} of the ${r.need} tokens it still ` +
                                                     `needed (num_new_tokens = min(num_new_tokens, token_budget))`));
  return panel("p-budget", "Part 2", "the token budget (max_num_batched_tokens)",
    el("div", {class: "barlabel"}, limit === null ? "the step's tokens (budget not recorded)"
                                                  : `to scale: the whole bar is the budget, ${limit} tokens`),
    bar("budget", scale, left ? `left ${left}` : ""),
    magnify ? el("div", {class: "barlabel magnified", "data-factor": factor},
                 `magnified ×${Number(factor.toPrecision(4))}: the same step against the first ${span} of the ` +
                 `${limit} tokens (above, it fills ${((100 * b.total) / limit).toPrecision(2)}% of the bar)`) : null,
    magnify ? bar("magnified", span, `…${left} left`) : null,
    el("p", {}, `RUNNING pass ${sum(b.running)} · WAITING pass ${sum(b.waiting)} · ` +
                (limit === null ? "budget not recorded" : `left over ${left} of ${limit}`)),
    clamps.length ? el("ul", {class: "clamps"}, clamps) : null);
}

// Panel 4: the SchedulerOutput as recorded.
function schedulerOutputPanel(model, s) {
  const e = s.schedule, nst = e.num_scheduled_tokens, c = e.scheduled_cached_reqs;
  const row = (id, kind, computed, blocks) => el("tr", {"data-req": id},
    el("td", {}, chip(model, id)), el("td", {}, kind), el("td", {}, computed), el("td", {}, nst[id]),
    el("td", {}, blocks));
  const ids = (list) => `[${list.join(", ")}]`, names = (list) => ids(list.map((id) => nameOf(model, id)));
  return panel("p-so", "Part 2", "SchedulerOutput",
    el("table", {},
       el("tr", {}, ["req_id", "kind", "num_computed_tokens", "num_scheduled_tokens", "block_ids"]
                       .map((h) => el("th", {}, h))),
       e.scheduled_new_reqs.map((r) => row(r.req_id, "new", r.num_computed_tokens, ids(r.block_ids))),
       c.req_ids.map((id, i) => row(id, c.resumed_from_preemption[i] ? "cached (resumed)" : "cached",
                                    c.num_computed_tokens[i], "+" + ids(c.new_block_ids[i])))),
    el("p", {}, `total_num_scheduled_tokens=${e.total_num_scheduled_tokens}  `,
       el("span", {"data-field": "finished_req_ids", "data-ids": JSON.stringify(e.finished_req_ids)},
          `finished_req_ids=${names(e.finished_req_ids)}`), "  ",
       el("span", {"data-field": "preempted_req_ids", "data-ids": JSON.stringify(e.preempted_req_ids)},
          `preempted_req_ids=${names(e.preempted_req_ids)}`)));
}
