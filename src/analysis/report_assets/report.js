// moeforge report: draws every panel from the JSON in <script id="report-data">. No libraries,
// no network: charts are SVG built here, hover reads the nearest logged step of each series.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const tip = document.createElement("div");
  tip.className = "tip";
  document.body.appendChild(tip);

  const el = (tag, attrs, parent) => {
    const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    if (parent) parent.appendChild(e);
    return e;
  };
  const fmt = (v) => {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e9) return v.toLocaleString("en-US");
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toPrecision(4);
  };
  const showTip = (ev, html) => {
    tip.innerHTML = html;
    tip.style.display = "block";
    tip.style.left = ev.pageX + 14 + "px";
    tip.style.top = ev.pageY + 10 + "px";
  };
  const hideTip = () => (tip.style.display = "none");
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

  // A panel: a titled section the browser test finds by data-panel.
  function panel(id, title, note) {
    const s = el("section", { class: "panel", "data-panel": id }, document.getElementById("panels"));
    el("h2", { text: title }, s);
    if (note) el("p", { class: "note", text: note }, s);
    return s;
  }

  // series: [{name, x: [], y: [], dashed}]; hover shows every series at its nearest x.
  function lineChart(parent, series, opt) {
    series = series.filter((s) => s.x.length > 0);
    const W = 560, H = 300, L = 62, R = 12, T = 28, B = 40;
    const box = el("div", { class: "chart" }, parent);
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "line-chart" }, box);
    el("svg:text", { x: L, y: 16, class: "title", text: opt.title }, svg);
    if (series.length === 0) {
      el("svg:text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty", text: "nothing logged yet" }, svg);
      return;
    }
    const xs = series.flatMap((s) => s.x), ys = series.flatMap((s) => s.y).filter(Number.isFinite);
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const log = opt.log && y0 > 0 && y1 / y0 > 20;
    const fy = (v) => (log ? Math.log10(v) : v);
    y0 = fy(y0); y1 = fy(y1);
    if (x1 === x0) x0 = Math.min(0, x0);  // one logged step: the axis starts at step 0
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { const d = Math.abs(y1) * 0.05 || 1; y1 += d; y0 -= d; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const sx = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
    const sy = (v) => T + (1 - (fy(v) - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; ++i) {
      const gy = y0 + ((y1 - y0) * i) / 4, py = T + (1 - i / 4) * (H - T - B);
      el("svg:line", { x1: L, x2: W - R, y1: py, y2: py, class: "grid" }, svg);
      el("svg:text", { x: L - 6, y: py + 4, "text-anchor": "end", class: "tick", text: fmt(log ? 10 ** gy : gy) }, svg);
      const gx = x0 + ((x1 - x0) * i) / 4;
      el("svg:text", { x: sx(gx), y: H - B + 16, "text-anchor": "middle", class: "tick", text: fmt(Math.round(gx)) }, svg);
    }
    el("svg:text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis", text: opt.x || "step" }, svg);
    series.forEach((s, i) => {
      const c = s.color || COLORS[i % COLORS.length];
      const d = s.x.map((x, j) => (Number.isFinite(s.y[j]) ? `${sx(x).toFixed(1)},${sy(s.y[j]).toFixed(1)}` : null)).filter((p) => p);
      if (d.length === 1) el("svg:circle", { cx: d[0].split(",")[0], cy: d[0].split(",")[1], r: 3, fill: c }, svg);
      else el("svg:path", { d: "M" + d.join("L"), stroke: c, fill: "none", "stroke-width": 1.6, "stroke-dasharray": s.dashed ? "5,3" : "" }, svg);
    });
    const legend = el("div", { class: "legend" }, box);
    series.forEach((s, i) => {
      const item = el("span", {}, legend);
      el("i", { style: `background:${s.color || COLORS[i % COLORS.length]}` }, item);
      item.appendChild(document.createTextNode(s.name));
    });
    const cross = el("svg:line", { y1: T, y2: H - B, class: "cross", visibility: "hidden" }, svg);
    svg.addEventListener("mousemove", (ev) => {
      const r = svg.getBoundingClientRect();
      const x = x0 + ((ev.clientX - r.left) * (W / r.width) - L) / (W - L - R) * (x1 - x0);
      cross.setAttribute("x1", sx(x)); cross.setAttribute("x2", sx(x)); cross.setAttribute("visibility", "visible");
      const rows = series.map((s, i) => {
        let j = 0;
        s.x.forEach((v, k) => { if (Math.abs(v - x) < Math.abs(s.x[j] - x)) j = k; });
        return `<i style="background:${s.color || COLORS[i % COLORS.length]}"></i>${esc(s.name)} @ ${fmt(s.x[j])}: <b>${fmt(s.y[j])}</b>`;
      });
      showTip(ev, rows.join("<br>"));
    });
    svg.addEventListener("mouseleave", () => { hideTip(); cross.setAttribute("visibility", "hidden"); });
  }

  // rows x columns of values; colour by value / max; hover names the cell.
  function heatmap(parent, values, opt) {
    const rows = values.length, cols = Math.max(...values.map((r) => r.length), 1);
    const cell = Math.max(4, Math.min(28, Math.floor(480 / cols))), L = 80, T = 28;
    const W = L + cols * cell + 20, H = T + rows * cell + 34;
    const box = el("div", { class: "chart" }, parent);
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "heatmap" }, box);
    el("svg:text", { x: 4, y: 16, class: "title", text: opt.title }, svg);
    const vmax = Math.max(...values.flat(), 1e-12);
    values.forEach((row, r) => {
      el("svg:text", { x: L - 6, y: T + r * cell + cell / 2 + 4, "text-anchor": "end", class: "tick", text: opt.rows[r] }, svg);
      row.forEach((v, c) => {
        const t = v / vmax;
        const rect = el("svg:rect", { x: L + c * cell, y: T + r * cell, width: cell - 1, height: cell - 1, class: v === 0 ? "zero" : "",
          fill: `rgb(${Math.round(247 - 239 * t)},${Math.round(251 - 203 * t)},${Math.round(255 - 148 * t)})` }, svg);
        rect.addEventListener("mousemove", (ev) => showTip(ev, `${esc(opt.rows[r])}, ${opt.col} ${c}: <b>${fmt(v)}</b>${opt.unit || ""}`));
        rect.addEventListener("mouseleave", hideTip);
      });
    });
    el("svg:text", { x: L + (cols * cell) / 2, y: H - 8, "text-anchor": "middle", class: "axis", text: `${opt.col} (0..${cols - 1}); red outline: no tokens` }, svg);
  }

  // header + rows (arrays of values); click a header to sort.
  function table(parent, header, rows) {
    const t = el("table", { class: "sortable" }, parent);
    const hr = el("tr", {}, el("thead", {}, t));
    const body = el("tbody", {}, t);
    const draw = () => {
      body.innerHTML = "";
      rows.forEach((r) => { const tr = el("tr", {}, body); r.forEach((v) => el("td", { text: fmt(v), class: typeof v === "number" ? "num" : "" }, tr)); });
    };
    header.forEach((h, i) => {
      const th = el("th", { text: h, title: "click to sort" }, hr);
      th.addEventListener("click", () => {
        const dir = th.dataset.dir === "asc" ? -1 : 1;
        hr.querySelectorAll("th").forEach((o) => delete o.dataset.dir);
        th.dataset.dir = dir === 1 ? "asc" : "desc";
        rows.sort((a, b) => (typeof a[i] === "number" && typeof b[i] === "number" ? a[i] - b[i] : String(a[i]).localeCompare(String(b[i]))) * dir);
        draw();
      });
    });
    draw();
    return t;
  }

  const runs = DATA.runs;
  const many = runs.length > 1;
  const label = (run, what) => (many ? `${run.name} ${what}` : what);

  // Summary table: one row per run, from summary.json or, while training, the last records.
  {
    const p = panel("summary", "Summary", DATA.note);
    table(p, ["run", "status", "method", "step", "train loss", "val loss", "val accuracy", "items/s", "parameters", "active", "elapsed s"],
      runs.map((r) => [r.name, r.status, r.method, r.step, r.train_loss, r.val_loss, r.val_accuracy ?? "–", r.throughput, r.parameters ?? "–", r.active ?? "–", r.elapsed]));
  }
  // Config and environment: one column per run; rows where the runs differ are marked.
  {
    const p = panel("config", "Config and environment", many ? "One column per run; ≠ marks keys whose values differ." : "");
    const keys = [...new Set(runs.flatMap((r) => Object.keys(r.facts)))];
    const groups = {};  // one table per top-level section, side by side
    keys.forEach((k) => {
      const vals = runs.map((r) => (k in r.facts ? r.facts[k] : "–"));
      const differ = many && new Set(vals.map((v) => JSON.stringify(v))).size > 1;
      const [group, ...rest] = k.includes(".") ? k.split(".") : ["run", k];
      (groups[group] = groups[group] || []).push([(differ ? "≠ " : "") + rest.join("."), ...vals]);
    });
    const row = el("div", { class: "tables" }, p);
    Object.entries(groups).forEach(([g, rows]) => table(el("div", {}, row), [g, ...runs.map((r) => r.name)], rows));
    runs.forEach((r) => {
      const c = el("details", {}, p);
      el("summary", { text: `${r.name}: config.toml (${r.dir})` }, c);
      el("pre", { text: r.config }, c);
    });
  }
  // Loss curves, all runs overlaid.
  {
    const p = panel("loss", "Loss", many ? "Runs overlaid: solid = training, dashed = validation." : "");
    lineChart(p, runs.map((r, i) => ({ name: label(r, "train"), x: r.train.step, y: r.train.loss, color: COLORS[i % COLORS.length] })), { title: "training loss", log: true });
    const val = [];
    runs.forEach((r, i) => Object.entries(r.val.losses).forEach(([dom, y], j) =>
      val.push({ name: label(r, dom), x: r.val.step, y, dashed: many && j > 0,
        color: COLORS[(Object.keys(r.val.losses).length > 1 ? i * 4 + j : i) % COLORS.length] })));
    lineChart(p, val, { title: "validation loss per domain" });
    if (runs.some((r) => r.val.accuracy.length)) lineChart(p, runs.map((r, i) => ({ name: label(r, "accuracy"), x: r.val.step, y: r.val.accuracy, color: COLORS[i % COLORS.length] })), { title: "validation accuracy" });
  }
  // Optimiser and speed.
  {
    const p = panel("optim", "Learning rate, gradient norm, throughput");
    const each = (key) => runs.map((r, i) => ({ name: r.name, x: r.train.step, y: r.train[key], color: COLORS[i % COLORS.length] }));
    lineChart(p, each("lr"), { title: "learning rate" });
    lineChart(p, each("grad_norm"), { title: "gradient norm (before clipping)", log: true });
    lineChart(p, each("throughput"), { title: `${runs[0].items}/s` });
  }
  // Per MoE layer: balance over time, usage heatmap, aux losses, method panels.
  runs.filter((r) => r.moe.length).forEach((r, ri) => {
    const tag = many ? ` — ${r.name}` : "";
    const steps = r.moe_steps;
    const layerSeries = (key) => r.moe.filter((m) => m.series[key]).map((m, i) => ({ name: `block ${m.layer}`, x: steps, y: m.series[key], color: COLORS[i % COLORS.length] }));
    const b = panel(`balance-${ri}`, "Load balance per MoE layer" + tag, "max/mean of the units' loads, their coefficient of variation, and units that got no token in the logged step.");
    b.dataset.kind = "balance";
    lineChart(b, layerSeries("max_over_mean"), { title: "max / mean load" });
    lineChart(b, layerSeries("cv"), { title: "CV of the load" });
    lineChart(b, layerSeries("dead"), { title: "dead units" });
    const u = panel(`usage-${ri}`, "Expert usage (last logged step)" + tag, r.pooled ? "Rows: MoE blocks; columns: the shared pool's experts." : "Rows: MoE blocks; columns: each block's experts (or expert blocks).");
    u.dataset.kind = "usage";
    heatmap(u, r.moe.map((m) => { const s = m.load.reduce((a, v) => a + v, 0) || 1; return m.load.map((v) => v / s); }),
      { title: "share of the layer's routed pairs", rows: r.moe.map((m) => `block ${m.layer}`), col: "unit" });
    const lossKeys = [...new Set(r.moe.flatMap((m) => m.loss_keys))];
    if (lossKeys.length) {
      const a = panel(`aux-${ri}`, "Auxiliary losses" + tag);
      a.dataset.kind = "aux";
      lossKeys.forEach((k) => lineChart(a, layerSeries(k), { title: k, log: true }));
    }
    const countKeys = [...new Set(r.moe.flatMap((m) => m.count_keys))];
    const mp = panel(`method-${ri}`, (r.method_panel || "Routing") + tag, r.method_note);
    mp.dataset.kind = "method";
    ["units_per_token", ...countKeys].forEach((k) => lineChart(mp, layerSeries(k), { title: k === "units_per_token" ? r.units_label : `mean ${k.replace(/_mean$/, "")} per token` }));
    r.moe.forEach((m) => Object.entries(m.hist).forEach(([k, h]) =>
      heatmap(mp, [h], { title: `block ${m.layer}: tokens by ${k} (last logged step)`, rows: [`block ${m.layer}`], col: k })));
  });
  // Pictures the analysis commands left in the run (usage, probes, saliency, confusion matrix).
  runs.filter((r) => r.artifacts.length).forEach((r, ri) => {
    const p = panel(`artifacts-${ri}`, "Analyses" + (many ? ` — ${r.name}` : ""), "Written by moeforge analysis commands into the run or its latest checkpoint.");
    p.dataset.kind = "artifacts";
    r.artifacts.forEach((a) => {
      const f = el("figure", { class: "artifact" }, p);
      f.innerHTML = a.svg;
      el("figcaption", { text: a.title ? `${a.title} — ${a.file}` : a.file }, f);
    });
  });
  document.body.dataset.ready = "1";
})();
