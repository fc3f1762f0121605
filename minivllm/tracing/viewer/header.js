// header.js: the header in a lecture hall. At the top of the page it is expanded (the title, the run, the
// event marks, this step's events); once the page scrolls it collapses to one line (prev, the slider, next,
// the step, its events in brief: click them to open the whole header over the page) so the panels get the
// screen. The header is fixed and the page keeps room for it expanded, so collapsing moves nothing under it.
// Marks too close to sit side by side on their track (many steps on a narrow screen) are stacked in lanes.
"use strict";

const COLLAPSE_AT = 24;  // px scrolled before the header collapses
const MAX_LANES = 3;     // a mark that finds no free lane is not drawn (the row's title counts them)

function setupHeader() {
  const header = document.querySelector("header"), body = document.body;
  const room = () => {  // keep the page's top clear of the expanded header
    if (!body.classList.contains("compact")) body.style.paddingTop = `${header.offsetHeight}px`;
  };
  const update = () => {
    const compact = window.scrollY > COLLAPSE_AT;
    if (compact !== body.classList.contains("compact")) {
      body.classList.toggle("compact", compact);
      body.classList.remove("header-open");
      if (!compact) stackMarks();
      room();
    }
  };
  new ResizeObserver(room).observe(header);
  window.addEventListener("scroll", update, {passive: true});
  window.addEventListener("resize", () => { stackMarks(); room(); });
  document.getElementById("brief").addEventListener("click", () => {
    body.classList.toggle("header-open");
    stackMarks();
  });
  update();
  room();
}

// Each track's marks, left to right: into the first lane whose last mark ends before this one starts.
function stackMarks() {
  for (const track of document.querySelectorAll("#marks .track")) {
    if (!track.offsetParent) continue;  // not drawn now (the header is collapsed)
    const ends = [], marks = [...track.querySelectorAll(".mark")];
    let height = 0, hidden = 0;
    for (const m of marks) {
      m.hidden = false;
      m.style.top = "0px";
      const box = m.getBoundingClientRect();
      height = Math.max(height, box.height + 2);
      let lane = ends.findIndex((right) => right + 2 <= box.left);
      if (lane < 0 && ends.length < MAX_LANES) lane = ends.push(-Infinity) - 1;
      if (lane < 0) {
        m.hidden = true;
        hidden++;
        continue;
      }
      ends[lane] = box.right;
      m.dataset.lane = String(lane);
    }
    marks.forEach((m) => { m.style.top = `${Number(m.dataset.lane || 0) * height}px`; });
    track.style.height = `${Math.max(1, ends.length) * height}px`;
    track.parentNode.title = hidden ? `${hidden} of ${marks.length} marks not drawn: too close to their ` +
                                      "neighbours at this width (the slider reaches their steps)" : "";
  }
}
