// overlap.js: async scheduling in the first panel (tracing/overlap.py prints the same in the terminal). EngineCore's
// batch queue holds two steps: step N is scheduled while step N-1's execute_model runs. Drawn for a trace recorded
// with async scheduling: a timeline of steps N-1 and N on one time axis, to scale (every bar's left edge and width are
// its recorded times over the axis), the placeholders schedule() left in flight, and the tokens update_from_output
// dropped. A trace without async scheduling gets one line saying it is off.
"use strict";

const ms = (seconds) => `${(seconds * 1e3).toFixed(1)} ms`;

// A tick spacing of 1, 2 or 5 times a power of ten, giving about four ticks over `span` seconds.
function tickStep(span) {
  const raw = span / 4, p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((k) => k * p).find((k) => k >= raw);
}

function asyncView(model, s) {
  if (!model.info.async_scheduling) {
    return el("p", {class: "note", "data-async": "off"}, "async scheduling: off (schedule() of step N + 1 waits " +
                                                        "until update_from_output() of step N has run)");
  }
  const prev = model.steps.find((x) => x.n === s.n - 1);
  return el("div", {class: "async", "data-async": "on"},
            el("h3", {}, "async scheduling: two steps in flight"),
            timeline(model, s, prev), placeholderList(model, s), droppedList(model, s));
}

// Step N's row: a tick where schedule() began, the time its batch waited in the batch queue for the worker, and
// its execute_model; step N-1's row: its execute_model (it was scheduled earlier, during step N-2). The overlap,
// schedule() of N beginning before execute_model of N-1 ended, is a band across both rows.
function timeline(model, s, prev) {
  const began = s.schedule.schedule_began, ex = s.execute, pex = prev && prev.execute;
  if (began === undefined) {
    return el("p", {class: "note"}, "timings not recorded (the workers run in other processes: asking them for a " +
                                    "step's record would wait for the step in flight)");
  }
  const timed = (e) => e && e.began !== undefined;
  const times = [began, ...(timed(ex) ? [ex.began, ex.ended] : []), ...(timed(pex) ? [pex.began, pex.ended] : [])];
  const t0 = Math.min(...times), t1 = Math.max(...times), span = t1 - t0 || 1e-6;
  const x = (t) => `${(100 * (t - t0)) / span}%`;
  const bar = (kind, step, from, to, text, tip) => el("div", {
    class: `tl-bar ${kind}`, "data-kind": kind, "data-step": step, "data-from": from, "data-to": to, title: tip,
    style: {left: x(from), width: `${(100 * (to - from)) / span}%`}}, text);
  const lane = (name, ...bars) => el("div", {class: "tl-lane"}, el("span", {class: "tl-name"}, name),
                                     el("div", {class: "tl-track"}, ...bars));
  const lanes = [];
  if (prev) {
    lanes.push(lane(`step ${prev.n}`, timed(pex)
      ? bar("execute", prev.n, pex.began, pex.ended, `execute_model ${ms(pex.ended - pex.began)}`,
            `step ${prev.n}: execute_model ran ${ms(pex.ended - pex.began)}`)
      : el("span", {class: "empty"}, "no forward recorded")));
  }
  const mine = [el("div", {class: "tl-tick", "data-kind": "schedule", "data-step": s.n, "data-at": began,
                           style: {left: x(began)}, title: `step ${s.n}: schedule() began`})];
  if (timed(ex)) {
    mine.push(bar("queued", s.n, began, ex.began, "schedule() → batch queue",
                  `step ${s.n}: from schedule() to execute_model: ${ms(ex.began - began)} (scheduled, then waiting ` +
                  "in the batch queue for the worker)"),
              bar("execute", s.n, ex.began, ex.ended, `execute_model ${ms(ex.ended - ex.began)}`,
                  `step ${s.n}: execute_model ran ${ms(ex.ended - ex.began)}`));
  } else {
    mine.push(el("span", {class: "tl-none", style: {left: x(began)}}, `schedule(): ${s.schedule.total_num_scheduled_tokens}` +
                                                                      " tokens, no forward"));
  }
  lanes.push(lane(`step ${s.n}`, ...mine));
  const overlap = timed(pex) && began < pex.ended;
  const band = overlap ? el("div", {class: "tl-overlap", "data-from": began, "data-to": pex.ended,
                                    style: {left: x(began), width: `${(100 * (pex.ended - began)) / span}%`}}) : null;
  const step = tickStep(span), ticks = [];
  for (let t = 0; t <= span + 1e-12; t += step) {
    ticks.push(el("span", {class: "tl-axis-tick", style: {left: x(t0 + t)}}, `${Number((t * 1e3).toPrecision(3))}`));
  }
  const pieces = [];
  if (timed(pex)) {
    pieces.push(overlap ? `schedule() of step ${s.n} began ${ms(began - pex.began)} into step ${prev.n}'s ` +
                          `execute_model (which ran ${ms(pex.ended - pex.began)}): the two overlap for ` +
                          `${ms(pex.ended - began)}`
                        : `schedule() of step ${s.n} began ${ms(began - pex.ended)} after step ${prev.n}'s ` +
                          "execute_model ended: no overlap this time");
    if (timed(ex)) pieces.push(`the worker waited ${ms(Math.max(0, ex.began - pex.ended))} between the two forwards`);
  } else if (!prev) {
    pieces.push(`step ${s.n} is the first: nothing ran before it`);
  }
  return el("div", {class: "timeline", "data-t0": t0, "data-t1": t1},
    el("div", {class: "tl-body"}, lanes, band ? el("div", {class: "tl-bandlayer"}, band) : null),
    el("div", {class: "tl-lane tl-axis"}, el("span", {class: "tl-name"}, "ms"), el("div", {class: "tl-track"}, ticks)),
    el("p", {class: "tl-caption", "data-overlap": overlap ? "yes" : "no"}, pieces.join("; ") + ".",
       el("br"), el("span", {class: "note"}, "To scale, times from time.monotonic() in EngineCore and the worker. ",
                    el("span", {class: "key execute"}), " execute_model (the forward) ",
                    el("span", {class: "key queued"}), " scheduled, waiting in the batch queue for the worker ",
                    el("span", {class: "key tick"}), " schedule() began",
                    overlap ? [" ", el("span", {class: "key overlap"}), " the overlap"] : "", ".")));
}

// num_output_placeholders after schedule(): per running request, the tokens scheduled whose values are not known yet.
function placeholderList(model, s) {
  const held = Object.entries(s.schedule.placeholders || {});
  return el("div", {class: "placeholders"},
    el("b", {}, "placeholders after schedule(): "),
    held.length ? held.map(([id, n]) => el("span", {class: "ph", "data-req": id, "data-n": n},
                                           chip(model, id), `${n} in flight`))
                : el("span", {class: "empty"}, "none"),
    el("div", {class: "note"}, "A running request is given its next token before the previous one is known: " +
                               "num_output_placeholders counts those tokens; update_from_output() fills one in per step."));
}

// Tokens of a request that had already finished: scheduled (step N) before update_from_output() of step N-1 ended it.
function droppedList(model, s) {
  const dropped = Object.entries((s.update && s.update.dropped) || {});
  const next = model.steps.find((x) => x.n === s.n + 1);
  const later = Object.keys((next && next.update && next.update.dropped) || {});
  if (!dropped.length && !later.length) return null;
  return el("div", {class: "dropped"},
    dropped.map(([id, tokens]) => el("div", {class: "drop", "data-req": id, "data-tokens": JSON.stringify(tokens)},
      el("b", {}, "dropped: "), chip(model, id), ` token [${tokens.join(", ")}]: `,
      `${nameOf(model, id)} finished in step ${model.finishedAt[id] ? model.finishedAt[id].step : s.n - 1}, but ` +
      `step ${s.n} was scheduled before that was known; update_from_output() drops the token, never given to the caller.`)),
    later.map((id) => el("div", {class: "drop-next", "data-req": id}, chip(model, id),
      ` finishes here, yet step ${s.n + 1} already scheduled it a token: that token is dropped in step ${s.n + 1}.`)));
}
