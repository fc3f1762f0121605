// viewer.js: one engine step at a time. The slider, the previous/next buttons, the arrow keys and the URL
// hash #step=N all choose the step; events (admission, preemption, ...) are marked on the slider so a
// reader jumps to them. A lecture note can link to a moment: trace.html#step=6.
// Live mode (minivllm serve's /trace): the page follows the server's event stream, rebuilds its model from
// the window it holds after each step, and shows the newest step unless the user moved to another one.
"use strict";

function startViewer() {
  const data = JSON.parse(document.getElementById("trace-data").textContent);
  const slider = document.getElementById("slider");
  const label = document.getElementById("step-label");
  const main = document.getElementById("panels");
  let model = null, last = 0, follow = true;
  const stepNumber = (i) => model.steps[i - 1].n;  // position on the slider -> the engine's step number
  const position = (n) => model.steps.findIndex((s) => s.n === n) + 1;  // 0: not in the trace (window)

  // (Re)build everything that depends on the whole trace: the run line and the marks under the slider.
  function load(d) {
    model = buildModel(d);
    last = model.steps.length;
    slider.min = 1;
    slider.max = Math.max(1, last);
    document.getElementById("run").textContent =
      `${model.info.num_gpu_blocks} KV blocks of ${model.bs} tokens, ` +
      `max_num_batched_tokens=${model.config.max_num_batched_tokens ?? "not recorded"}, ` +
      `max_num_seqs=${model.config.max_num_seqs ?? "not recorded"}, ${model.info.attention_backend} attention; ` +
      `${last} steps, ${Object.keys(model.reqs).length} requests` +
      (model.speculative ? `, speculative decoding (drafts in ${model.steps.filter((s) => s.verify.length).length} ` +
                           `steps)` : "") +
      (d.live ? ` (live: the last ${last} steps of the running server)` : "");
    const marks = document.getElementById("marks");
    marks.replaceChildren();
    // One row per kind that happened, each mark a button that jumps to its step; the kinds that did not happen
    // share one line (a run without drafts leaves rejection out: it cannot happen there).
    const none = [];
    for (const kind of EVENT_KINDS.filter((k) => model.speculative || !SPEC_KINDS.includes(k))) {
      const at = model.steps.map((s, i) => [s, i + 1]).filter(([s]) => s.events.some((e) => e.kind === kind));
      if (!at.length) {
        none.push(kind);
        continue;
      }
      const row = el("div", {class: "markrow", "data-kind": kind}, el("span", {class: "kind"}, `${kind} (${at.length})`));
      const track = el("div", {class: "track"});
      for (const [s, i] of at) {
        const left = last > 1 ? (100 * (i - 1)) / (last - 1) : 0;
        const button = el("button", {class: "mark", "data-step": s.n, style: {left: `${left}%`},
                                     title: s.events.filter((e) => e.kind === kind).map((e) => e.text).join("\n")},
                          s.n);
        button.addEventListener("click", () => go(i));
        track.append(button);
      }
      row.append(track);
      marks.append(row);
    }
    if (none.length && last) marks.append(el("div", {class: "marknone", "data-kinds": none.join(",")},
                                             `none in these steps: ${none.join(", ")}`));
    stackMarks();
  }

  // Draw the step at slider position i: the header's event list, then the eight panels (nine with drafts,
  // one more under tensor parallelism).
  function show(i) {
    if (!last) {
      label.textContent = "waiting for the first step: send a request to the server";
      return;
    }
    const s = model.steps[i - 1];
    slider.value = i;
    label.textContent = `step ${s.n} / ${model.steps[last - 1].n}`;
    document.body.dataset.step = String(s.n);
    const evs = document.getElementById("events");
    evs.replaceChildren(...(s.events.length ? s.events.map((e) => el("li", {"data-kind": e.kind},
                                                                        el("b", {}, e.kind), " ", chip(model, e.req), " ", e.text))
                                           : [el("li", {}, "a plain step: every scheduled request advances")]));
    const brief = document.getElementById("brief");  // the collapsed header's one line of events
    brief.textContent = s.events.length ? s.events.map((e) => `${e.kind} ${model.alias(e.req)}`).join(" · ")
                                        : "a plain step";
    brief.title = s.events.map((e) => e.text).join("\n") || "a plain step: every scheduled request advances";
    main.replaceChildren(stagesPanel(model, s), queuesPanel(model, s), budgetPanel(model, s),
                         schedulerOutputPanel(model, s), batchPanel(model, s), forwardContextPanel(model, s),
                         poolPanel(model, s), samplingPanel(model, s),
                         ...[specPanel(model, s), ranksPanel(model, s)].filter(Boolean));
    document.querySelectorAll(".mark.current").forEach((m) => m.classList.remove("current"));
    document.querySelectorAll(`.mark[data-step="${s.n}"]`).forEach((m) => m.classList.add("current"));
  }

  // Every way of moving writes the hash, so the address bar always names the step shown.
  function go(i) {
    if (!last) return;
    i = Math.min(last, Math.max(1, i));
    follow = i === last;  // moved off the newest step: stay there; back on it: follow again
    location.hash = `step=${stepNumber(i)}`;
    show(i);
  }
  const fromHash = () => {  // the slider position of the step the hash names
    const m = /^#step=(\d+)$/.exec(location.hash);
    if (!m || !last) return last ? (data.live ? last : 1) : 0;
    const i = position(Number(m[1]));
    return i || (Number(m[1]) < model.steps[0].n ? 1 : last);
  };
  window.addEventListener("hashchange", () => {  // a link or the address bar changed the step
    if (last && String(stepNumber(fromHash())) !== document.body.dataset.step) {
      follow = fromHash() === last;
      show(fromHash());
    }
  });
  slider.addEventListener("input", () => go(Number(slider.value)));
  document.getElementById("prev").addEventListener("click", () => go(fromHash() - 1));
  document.getElementById("next").addEventListener("click", () => go(fromHash() + 1));
  document.addEventListener("keydown", (ev) => {
    if (ev.target === slider) return;  // the slider moves itself on arrow keys
    if (ev.key === "ArrowLeft") go(fromHash() - 1);
    if (ev.key === "ArrowRight") go(fromHash() + 1);
    if (ev.key === "Home") go(1);
    if (ev.key === "End") go(last);
  });
  setupHeader();
  load(data);
  follow = !/^#step=\d+$/.test(location.hash);
  show(fromHash());
  document.body.dataset.ready = "1";
  if (data.live) followLive(data, (d) => {
    const shown = document.body.dataset.step;
    load(d);
    if (follow || !shown) {
      if (last) history.replaceState(null, "", `#step=${stepNumber(last)}`);
      show(last);
    } else {
      show(position(Number(shown)) || 1);  // the step the user chose, or the oldest kept once it left
    }
  });
}

// Live: the server's Server-Sent Events. Each message holds the events since the last one (or, with
// reset, the whole window) plus a prelude (requests still alive whose first events left the window).
// The page keeps only the events from the window's first one on, so its memory is bounded as the server's.
function followLive(data, redraw) {
  let events = [];
  const source = new EventSource(data.live);
  source.onmessage = (msg) => {
    const m = JSON.parse(msg.data);
    events = m.reset ? m.events : events.concat(m.events);
    events = events.filter((e) => e.seq >= m.first_seq);
    const live = Object.assign({}, data, {trace: Object.assign({}, data.trace, {events: m.prelude.concat(events)})});
    redraw(live);
    document.body.dataset.liveSeq = String(events.length ? events[events.length - 1].seq : -1);
  };
  window.addEventListener("beforeunload", () => source.close());
}

document.addEventListener("DOMContentLoaded", startViewer);
