// viewer.js: one engine step at a time. The slider, the previous/next buttons, the arrow keys and the URL
// hash #step=N all choose the step; events (admission, preemption, ...) are marked on the slider so a
// reader jumps to them. A lecture note can link to a moment: trace.html#step=6.
"use strict";

function startViewer() {
  const data = JSON.parse(document.getElementById("trace-data").textContent);
  const model = buildModel(data);
  const last = model.steps.length;
  const slider = document.getElementById("slider");
  const label = document.getElementById("step-label");
  const main = document.getElementById("panels");
  slider.min = 1;
  slider.max = last;
  document.getElementById("run").textContent =
    `${model.info.num_gpu_blocks} KV blocks of ${model.bs} tokens, ` +
    `max_num_batched_tokens=${model.config.max_num_batched_tokens ?? "not recorded"}, ` +
    `max_num_seqs=${model.config.max_num_seqs ?? "not recorded"}, ${model.info.attention_backend} attention; ` +
    `${last} steps, ${Object.keys(model.reqs).length} requests`;

  // Event markers under the slider, one row per kind, each a button that jumps to its step.
  const marks = document.getElementById("marks");
  for (const kind of EVENT_KINDS) {
    const at = model.steps.filter((s) => s.events.some((e) => e.kind === kind));
    const row = el("div", {class: "markrow", "data-kind": kind}, el("span", {class: "kind"}, `${kind} (${at.length})`));
    const track = el("div", {class: "track"});
    for (const s of at) {
      const left = last > 1 ? (100 * (s.n - 1)) / (last - 1) : 0;
      const button = el("button", {class: "mark", "data-step": s.n, style: {left: `${left}%`},
                                   title: s.events.filter((e) => e.kind === kind).map((e) => e.text).join("\n")},
                        s.n);
      button.addEventListener("click", () => go(s.n));
      track.append(button);
    }
    row.append(track);
    marks.append(row);
  }

  // Draw step n: the header's event list, then the seven panels.
  function show(n) {
    const s = model.steps[n - 1];
    slider.value = n;
    label.textContent = `step ${n} / ${last}`;
    document.body.dataset.step = String(n);
    const evs = document.getElementById("events");
    evs.replaceChildren(...(s.events.length ? s.events.map((e) => el("li", {"data-kind": e.kind},
                                                                        el("b", {}, e.kind), " ", chip(model, e.req), " ", e.text))
                                           : [el("li", {}, "a plain step: every scheduled request advances")]));
    main.replaceChildren(stagesPanel(model, s), queuesPanel(model, s), budgetPanel(model, s),
                         schedulerOutputPanel(model, s), batchPanel(model, s), poolPanel(model, s),
                         samplingPanel(model, s));
    document.querySelectorAll(".mark.current").forEach((m) => m.classList.remove("current"));
    document.querySelectorAll(`.mark[data-step="${n}"]`).forEach((m) => m.classList.add("current"));
  }

  // Every way of moving writes the hash, so the address bar always names the step shown.
  function go(n) {
    n = Math.min(last, Math.max(1, n));
    location.hash = `step=${n}`;
    show(n);
  }
  const fromHash = () => {
    const m = /^#step=(\d+)$/.exec(location.hash);
    return m ? Math.min(last, Math.max(1, Number(m[1]))) : 1;
  };
  window.addEventListener("hashchange", () => {  // a link or the address bar changed the step
    if (String(fromHash()) !== document.body.dataset.step) show(fromHash());
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
  show(fromHash());
  document.body.dataset.ready = "1";
}

document.addEventListener("DOMContentLoaded", startViewer);
