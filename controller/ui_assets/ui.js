// tidegate status page: draws the daemon's own API (/v1/...) as tables and SVG charts.
// Hand-written, no build step, no external assets. Every value from the API is put into the page
// as text (textContent / SVG attributes), never as HTML.
"use strict";
(() => {
  const data = document.body.dataset;
  const WHO = JSON.parse(data.who);
  const POOLS = JSON.parse(data.pools);       // every pool, in tier order
  const TIERS = JSON.parse(data.tiers);       // pool -> tier
  const COLOURS = JSON.parse(data.colours);   // pool -> colour (controller/palette.py)
  const INK = JSON.parse(data.ink);
  const TARGET = JSON.parse(data.target);
  const SVGNS = "http://www.w3.org/2000/svg";
  const REFRESH_MS = 5000;
  const state = {hours: 3, model: null, status: null};

  // ---- small helpers -----------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      // the CSP forbids style attributes; properties set through the CSSOM are allowed
      else if (k === "style") for (const [prop, val] of Object.entries(v)) node.style.setProperty(prop, val);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
    return node;
  }
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
    return node;
  }
  async function api(path, options) {
    const opts = options || {};
    const headers = Object.assign({"X-Tidegate-UI": "1", "Accept": "application/json"}, opts.headers || {});
    const r = await fetch(path, Object.assign({credentials: "same-origin"}, opts, {headers}));
    const text = await r.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = text; }
    return {ok: r.ok, status: r.status, body};
  }
  function problem(r) {
    const detail = r.body && r.body.detail ? r.body.detail : String(r.body || "");
    return `refused by the daemon (HTTP ${r.status}): ${detail}`;
  }
  const fmt = (v, digits) => (v === null || v === undefined || Number.isNaN(v)) ? "-" : Number(v).toFixed(digits === undefined ? 0 : digits);
  const money = (v) => (v === null || v === undefined) ? "-" : "$" + Number(v).toFixed(2);
  const time = (iso) => iso ? iso.replace("T", " ").replace(/(\.\d+)?(\+00:00|Z)$/, "") : "-";
  function size(bytes) {
    return bytes < 1024 * 1024 ? `${(bytes / 1024).toFixed(1)} KB` : `${(bytes / 1024 / 1024).toFixed(1)} MB`;
  }
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "no expiry";
    if (seconds <= 0) return "expired";
    const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
  }
  function section(id, title, ...children) {
    let node = document.getElementById(id);
    const fresh = el("section", {id}, el("h2", {}, title), ...children);
    if (node) node.replaceWith(fresh); else document.getElementById("app").append(fresh);
    return fresh;
  }
  function table(headers, rows, attrs) {
    return el("table", attrs || {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows));
  }
  function legend(items) {
    return el("ul", {class: "legend"}, items.map(([label, colour, style]) =>
      el("li", {}, el("span", {class: "swatch " + (style || ""), style: {"--c": colour}}), label)));
  }

  // ---- fleet: desired / ready per pool, stacked by tier -------------------------------------
  function fleetBar(pools, key, y, width, scale) {
    const parts = [];
    let x = 0;
    for (const name of POOLS) {
      const p = pools[name];
      const n = p ? (p[key] || 0) : 0;
      if (!n) continue;
      const w = n * scale;
      parts.push(svg("rect", {x, y, width: w, height: 22, fill: COLOURS[name], "data-pool": name},
        svg("title", {}, `${name} (${TIERS[name]}): ${n} ${key.replace("_replicas", "")}`)));
      if (w > 18) parts.push(svg("text", {x: x + w / 2, y: y + 15, class: "in-bar"}, String(n)));
      x += w;
    }
    return parts;
  }
  function fleetChart(model) {
    const pools = model.pools;
    const total = (k) => POOLS.reduce((a, n) => a + ((pools[n] && pools[n][k]) || 0), 0);
    const max = Math.max(1, total("desired_replicas"), total("ready_replicas"));
    const W = 520, L = 60, scale = (W - L - 10) / max;
    const g = svg("g", {transform: `translate(${L},0)`},
      fleetBar(pools, "desired_replicas", 4, W, scale), fleetBar(pools, "ready_replicas", 32, W, scale));
    return svg("svg", {viewBox: `0 0 ${W} 60`, class: "fleet-chart", role: "img",
                       "aria-label": "replicas per pool, desired and ready"},
      svg("text", {x: 0, y: 19, class: "axis"}, "desired"), svg("text", {x: 0, y: 47, class: "axis"}, "ready"), g);
  }
  function renderFleet(status) {
    const cards = Object.entries(status.models).map(([name, m]) => {
      const sig = m.signals || {};
      const v = (k) => sig[k] ? sig[k].value : null;
      const rows = POOLS.filter((p) => m.pools[p]).map((p) => {
        const s = m.pools[p];
        return el("tr", {"data-pool": p},
          el("td", {}, el("span", {class: "swatch", style: {"--c": COLOURS[p]}}), p), el("td", {}, s.tier),
          el("td", {}, s.provider), el("td", {class: "num"}, fmt(s.desired_replicas)),
          el("td", {class: "num"}, fmt(s.ready_replicas)), el("td", {class: "num"}, fmt(s.nodes)),
          el("td", {class: "num"}, money(s.price_per_node_hour_usd)),
          el("td", {}, s.available === false ? `unavailable: ${s.unavailable_reason || "?"}` : "yes"));
      });
      return el("article", {class: "model", "data-model": name},
        el("h3", {}, name, " ", el("small", {}, `policy ${m.policy_version || "none"}`)),
        el("p", {class: "figures"},
          el("span", {}, el("b", {}, fmt(v("request_rate_per_s"), 1)), " req/s"),
          el("span", {}, "p99 ", el("b", {}, fmt(v("p99_latency_ms"))), " ms"),
          el("span", {}, "queue ", el("b", {}, fmt(v("queue_depth"), 1))),
          el("span", {}, el("b", {}, money(m.cost_per_hour_usd)), " per hour"),
          el("span", {}, el("b", {}, money(v("cost_per_million_tokens_usd"))), " per million tokens"),
          el("span", {}, "replicas ", el("b", {}, `${fmt(m.current_replicas)} \u2192 ${fmt(m.desired_replicas)}`)),
          m.last_decision ? el("span", {}, "last decision ", el("b", {}, m.last_decision.reason)) : null),
        fleetChart(m),
        table(["pool", "tier", "provider", "desired", "ready", "nodes", "$ / node-hour", "available"], rows,
              {class: "pools"}));
    });
    section("fleet", "Fleet now", cards);
  }

  // ---- timeline ------------------------------------------------------------------------------
  function panel(points, opts) {
    const W = 900, H = 120, L = 56, R = 10, T = 8, B = 18;
    const t0 = Date.parse(opts.since), t1 = Date.parse(opts.until);
    const xs = (iso) => L + (W - L - R) * (Date.parse(iso) - t0) / Math.max(1, t1 - t0);
    const ymax = niceCeil(opts.ymax);
    const ys = (v) => T + (H - T - B) * (1 - v / ymax);
    const g = [];
    for (const frac of [0, 0.5, 1]) {
      const y = ys(ymax * frac);
      g.push(svg("line", {x1: L, x2: W - R, y1: y, y2: y, class: "grid"}));
      g.push(svg("text", {x: L - 4, y: y + 4, class: "axis end"}, fmt(ymax * frac, Number.isInteger(ymax * frac) ? 0 : 1)));
    }
    g.push(svg("text", {x: L + 6, y: T + 10, class: "panel-label"}, opts.label));
    g.push(...opts.draw(xs, ys));
    for (const p of points.filter((q) => q.changed)) {
      const x = xs(p.at);
      g.push(svg("line", {x1: x, x2: x, y1: T, y2: H - B, class: "marker", "data-decision": p.id,
                          onclick: () => openDecision(p.id)}, svg("title", {}, `decision ${p.id}: ${p.reason}`)));
    }
    if (opts.axis) {
      for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
        const t = new Date(t0 + (t1 - t0) * frac).toISOString();
        const anchor = frac === 0 ? "axis" : frac === 1 ? "axis end" : "axis mid";
        g.push(svg("text", {x: L + (W - L - R) * frac, y: H - 4, class: anchor}, t.slice(11, 16)));
      }
    }
    return svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "panel", role: "img", "aria-label": opts.label}, g);
  }
  function niceCeil(v) {  // the axis top: a round number just above the largest value
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    return [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].map((m) => m * p).find((c) => c >= v * 0.999);
  }
  function stepPath(points, xs, ys, value) {
    let d = "", prev = null;
    for (const p of points) {
      const v = value(p);
      if (v === null || v === undefined) { prev = null; continue; }
      const x = xs(p.at), y = ys(v);
      d += prev === null ? `M${x},${y}` : `H${x}V${y}`;
      prev = y;
    }
    return d;
  }
  function linePath(points, xs, ys, value) {
    let d = "", pen = "M";
    for (const p of points) {
      const v = value(p);
      if (v === null || v === undefined) { pen = "M"; continue; }
      d += `${pen}${xs(p.at)},${ys(v)}`;
      pen = "L";
    }
    return d;
  }
  function stackedAreas(points, xs, ys) {
    const out = [];
    const base = points.map(() => 0);
    for (const pool of POOLS) {
      const top = points.map((p, i) => base[i] + ((p.ready && p.ready[pool]) || 0));
      if (top.every((v, i) => v === base[i])) continue;
      let d = "";
      points.forEach((p, i) => {
        const x = xs(p.at), nx = i + 1 < points.length ? xs(points[i + 1].at) : x;
        d += `${i ? "L" : "M"}${x},${ys(top[i])}L${nx},${ys(top[i])}`;
      });
      for (let i = points.length - 1; i >= 0; i--) {
        const x = xs(points[i].at), nx = i + 1 < points.length ? xs(points[i + 1].at) : x;
        d += `L${nx},${ys(base[i])}L${x},${ys(base[i])}`;
      }
      out.push(svg("path", {d: d + "Z", fill: COLOURS[pool], class: "area", "data-pool": pool},
        svg("title", {}, `${pool} ready replicas`)));
      top.forEach((v, i) => { base[i] = v; });
    }
    return out;
  }
  async function renderTimeline() {
    const model = state.model;
    if (!model) return;
    const r = await api(`ui/timeline?model=${encodeURIComponent(model)}&hours=${state.hours}`);
    const controls = el("div", {class: "controls"},
      el("label", {}, "model ", el("select", {id: "tl-model", onchange: (e) => { state.model = e.target.value; renderTimeline(); }},
        Object.keys(state.status.models).map((m) => el("option", {value: m, selected: m === model}, m)))),
      el("label", {}, " last ", el("select", {id: "tl-hours", onchange: (e) => { state.hours = Number(e.target.value); renderTimeline(); }},
        [1, 3, 6, 24].map((h) => el("option", {value: h, selected: h === state.hours}, `${h} h`)))));
    if (!r.ok) { section("timeline", "Timeline", controls, el("p", {class: "error"}, problem(r))); return; }
    const tl = r.body, pts = tl.points;
    if (!pts.length) { section("timeline", "Timeline", controls, el("p", {}, "no decisions in this window yet")); return; }
    const span = {since: tl.since, until: tl.until};
    const maxOf = (f) => Math.max(0, ...pts.map(f).filter((v) => v !== null && v !== undefined));
    const total = (p, k) => Object.values(p[k] || {}).reduce((a, b) => a + (b || 0), 0);
    const slo = tl.slo_p99_latency_ms;
    const pools = POOLS.filter((p) => pts.some((q) => (q.ready && q.ready[p]) || (q.desired && q.desired[p])));
    section("timeline", `Timeline: ${model}, last ${state.hours} h (${tl.decisions} decisions)`, controls,
      panel(pts, Object.assign({}, span, {label: "req/s", ymax: maxOf((p) => p.request_rate_per_s),
        draw: (xs, ys) => [svg("path", {d: linePath(pts, xs, ys, (p) => p.request_rate_per_s), class: "line", stroke: INK})]})),
      panel(pts, Object.assign({}, span, {label: "replicas", ymax: maxOf((p) => Math.max(total(p, "ready"), total(p, "desired"))),
        draw: (xs, ys) => [...stackedAreas(pts, xs, ys),
          svg("path", {d: stepPath(pts, xs, ys, (p) => total(p, "desired")), class: "line dashed", stroke: INK})]})),
      panel(pts, Object.assign({}, span, {label: "$/h", ymax: maxOf((p) => p.cost_per_hour_usd),
        draw: (xs, ys) => [svg("path", {d: stepPath(pts, xs, ys, (p) => p.cost_per_hour_usd), class: "line", stroke: INK})]})),
      panel(pts, Object.assign({}, span, {label: "p99 ms", axis: true,
        ymax: Math.max(slo || 0, maxOf((p) => p.p99_latency_ms)),
        draw: (xs, ys) => [svg("path", {d: linePath(pts, xs, ys, (p) => p.p99_latency_ms), class: "line", stroke: INK}),
          slo ? svg("line", {x1: xs(tl.since), x2: xs(tl.until), y1: ys(slo), y2: ys(slo), class: "slo", stroke: TARGET}) : null]})),
      legend([...pools.map((p) => [`${p} (${TIERS[p]}) ready`, COLOURS[p]]), ["desired total", INK, "dashed"],
              ["p99 SLO", TARGET, "dashed"], ["decision that changed replicas (click)", "#888", "marker"]]));
  }

  // ---- the local journal: decisions the database has not taken yet ------------------------------
  function journalWaiting(j) {  // null when nothing waits (no journal configured, or an empty one)
    if (!j || !j.bytes) return null;
    return j.decisions ? plural(j.decisions, "decision") : j.outcomes ? plural(j.outcomes, "outcome") : "entries";
  }
  function journalFlag(j, now) {
    const what = journalWaiting(j);
    if (!what) return null;
    // HH:MM of the daemon's clock, like the header's time; with the date when it is another day
    const sameDay = j.since && now && j.since.slice(0, 10) === now.slice(0, 10);
    const since = j.since ? ` since ${time(j.since).slice(sameDay ? 11 : 0, 16)}` : "";
    const why = j.replaying ? "replaying into the database" : j.database_error ? "database unreachable" : "waiting to be replayed";
    return el("span", {class: "flag", id: "journal-flag", title: j.database_error ? `the database refused: ${j.database_error}` : j.path},
      `journal: ${what} waiting (${size(j.bytes)})${since} \u2014 ${why}`);
  }
  function journalNote() {
    const what = journalWaiting(state.status && state.status.journal);
    return what ? el("p", {class: "notice", id: "decisions-journal"}, `Not listed yet: ${what} in the daemon's local ` +
      "journal, which the database did not take; the daemon writes them to the decision log when it does.") : null;
  }

  // ---- decisions -----------------------------------------------------------------------------
  async function renderDecisions() {
    const r = await api("v1/decisions?limit=12");
    if (!r.ok) { section("decisions", "Decisions", journalNote(), el("p", {class: "error"}, problem(r))); return; }
    const rows = r.body.items.map((d) => el("tr", {"data-decision": d.id, class: "clickable", onclick: () => openDecision(d.id)},
      el("td", {}, el("button", {type: "button", class: "link"}, `#${d.id}`)), el("td", {}, time(d.at)), el("td", {}, d.model),
      el("td", {class: "num"}, `${d.current_replicas} \u2192 ${d.replicas}`),
      el("td", {}, Object.entries(d.placement).filter(([, n]) => n).map(([p, n]) => `${p}=${n}`).join(", ") || "none"),
      el("td", {class: "num"}, money(d.cost_per_hour_usd)), el("td", {}, d.reason), el("td", {}, d.outcome || "-")));
    section("decisions", "Decisions (newest first; click one for its trace)", journalNote(),
      table(["id", "at", "model", "replicas", "placement", "$/h", "reason", "outcome"], rows, {class: "decisions"}));
  }
  async function openDecision(id) {
    const dialog = document.getElementById("decision");
    const body = dialog.querySelector(".body");
    body.replaceChildren(el("p", {}, `loading decision ${id}...`));
    if (!dialog.open) dialog.showModal();
    const r = await api(`v1/decisions/${id}`);
    if (!r.ok) { body.replaceChildren(el("p", {class: "error"}, problem(r))); return; }
    const d = r.body;
    const sig = d.signals || {};
    const signalRows = Object.entries(sig).filter(([, v]) => v && typeof v === "object" && "value" in v).map(([k, v]) =>
      el("tr", {}, el("td", {}, k), el("td", {class: "num"}, v.value === null ? "missing" : fmt(v.value, 2)), el("td", {}, v.reason || "")));
    body.replaceChildren(
      el("h3", {}, `Decision #${d.id}: ${d.model} at ${time(d.at)}`),
      el("p", {}, `${d.current_replicas} \u2192 ${d.replicas} replicas, ${money(d.cost_per_hour_usd)}/h, reason `, el("b", {}, d.reason),
        `, outcome ${d.outcome || "-"}${d.dry_run ? " (dry run)" : ""}, policy ${d.policy_version || "-"}`),
      el("h4", {}, "Stages"),
      table(["stage", "replicas", "reason", "why"], (d.trace || []).map((s) =>
        el("tr", {}, el("td", {}, s.name), el("td", {class: "num"}, fmt(s.replicas)), el("td", {}, s.reason), el("td", {class: "msg"}, s.message))),
        {class: "trace"}),
      el("h4", {}, "Recommendations"),
      table(["rule", "kind", "replicas", "reason", "why"], (d.recommendations || []).map((s) =>
        el("tr", {}, el("td", {}, s.rule), el("td", {}, s.kind), el("td", {class: "num"}, fmt(s.replicas)), el("td", {}, s.reason),
          el("td", {class: "msg"}, s.message)))),
      el("h4", {}, "Signals"), table(["signal", "value", "missing because"], signalRows),
      el("h4", {}, "Actions"),
      table(["call", "pool", "arguments", "status", "error"], (d.actions || []).map((a) =>
        el("tr", {}, el("td", {}, a.call), el("td", {}, a.pool || ""), el("td", {class: "msg"}, JSON.stringify(a.arguments)),
          el("td", {}, a.status), el("td", {}, a.error || "")))));
  }

  // ---- overrides -----------------------------------------------------------------------------
  function overrideForm(models) {
    const msg = el("p", {id: "ov-message", role: "status"});
    const modelSelect = el("select", {name: "model", id: "ov-model"}, models.map((m) => el("option", {value: m}, m)));
    const poolSelect = el("select", {name: "pool", id: "ov-pool"}, el("option", {value: ""}, "(all pools)"),
      POOLS.map((p) => el("option", {value: p}, p)));
    const num = (name, label) => el("label", {}, label, el("input", {type: "number", min: 0, name, id: `ov-${name}`}));
    const form = el("form", {id: "ov-form", class: "override-form", onsubmit: async (e) => {
      e.preventDefault();
      const f = new FormData(form);
      const body = {kind: f.get("kind"), model: f.get("model"), reason: f.get("reason")};
      if (f.get("pool")) body.pool = f.get("pool");
      for (const k of ["replicas", "min_replicas", "max_replicas"]) if (f.get(k) !== "") body[k] = Number(f.get(k));
      if (f.get("ttl_min") !== "") body.ttl_s = Number(f.get("ttl_min")) * 60;
      const r = await api("v1/overrides", {method: "POST", body: JSON.stringify(body), headers: {"Content-Type": "application/json"}});
      msg.className = r.ok ? "ok" : "error";
      msg.textContent = r.ok ? `override #${r.body.id} set` : problem(r);
      if (r.ok) await renderOverrides();
    }},
      el("label", {}, "kind", el("select", {name: "kind", id: "ov-kind"},
        ["pin", "bounds", "freeze", "drain-pool"].map((k) => el("option", {value: k}, k)))),
      el("label", {}, "model", modelSelect), el("label", {}, "pool", poolSelect),
      num("replicas", "replicas"), num("min_replicas", "min"), num("max_replicas", "max"),
      el("label", {}, "TTL (min)", el("input", {type: "number", min: 1, name: "ttl_min", id: "ov-ttl", value: 60})),
      el("label", {class: "wide"}, "reason", el("input", {type: "text", name: "reason", id: "ov-reason", required: true, maxlength: 500})),
      el("button", {type: "submit", id: "ov-submit"}, "Set override"));
    const note = WHO.can_write ? null :
      el("p", {class: "hint"}, `You are logged in as ${WHO.name} (viewer): the daemon refuses writes from a viewer token.`);
    return [form, note, msg];
  }
  async function renderOverrides() {
    const r = await api("v1/overrides");
    const existing = document.getElementById("ov-form");
    const now = state.status ? Date.parse(state.status.at) : Date.now();
    let listing;
    if (!r.ok) listing = el("p", {class: "error"}, problem(r));
    else if (!r.body.items.length) listing = el("p", {id: "ov-none"}, "no active overrides");
    else listing = table(["id", "kind", "model", "pool", "replicas / bounds", "expires in", "author", "reason", ""],
      r.body.items.map((o) => el("tr", {"data-override": o.id},
        el("td", {}, `#${o.id}`), el("td", {}, o.kind), el("td", {}, o.model), el("td", {}, o.pool || "all"),
        el("td", {}, o.replicas !== null ? String(o.replicas) : `[${o.min_replicas ?? "-"}, ${o.max_replicas ?? "-"}]`),
        el("td", {}, duration(o.expires_at ? (Date.parse(o.expires_at) - now) / 1000 : null)),
        el("td", {}, o.author), el("td", {class: "msg"}, o.reason),
        el("td", {}, el("button", {type: "button", class: "remove", onclick: async () => {
          const d = await api(`v1/overrides/${o.id}`, {method: "DELETE"});
          const msg = document.getElementById("ov-message");
          msg.className = d.ok ? "ok" : "error";
          msg.textContent = d.ok ? `override #${o.id} removed` : problem(d);
          if (d.ok) await renderOverrides();
        }}, "Remove")))), {class: "overrides"});
    const list = el("div", {id: "ov-list"}, listing);
    if (existing) { document.getElementById("ov-list").replaceWith(list); return; }
    section("overrides", "Overrides", list, overrideForm(Object.keys(state.status.models)));
  }

  // ---- policies and shadow -------------------------------------------------------------------
  function policyError(e) {
    if (typeof e === "string") return e;
    const where = e.file ? (e.line ? `${e.file}:${e.line}` : e.file) : "";
    return [where, e.path, e.message].filter((x) => x).join(": ");
  }
  async function renderPolicies() {
    const [r, v] = await Promise.all([api("v1/policies"), api("ui/policy-versions")]);
    if (!r.ok) { section("policies", "Policies", el("p", {class: "error"}, problem(r))); return; }
    const p = r.body;
    const models = Object.entries(p.models || {}).map(([m, s]) => el("tr", {},
      el("td", {}, m), el("td", {}, s.version || "-"), el("td", {}, (s.rules || []).map((x) => `${x.name} (${x.kind})`).join(", ")),
      el("td", {}, s.kept_previous ? "kept the last good version" : "in force"),
      el("td", {class: "msg"}, (s.errors || []).map(policyError).join("; ") || "none")));
    const errors = (p.errors || []).map((e) => el("li", {class: "error"}, policyError(e)));
    const versions = v.ok ? table(["model", "version", "first seen", "sources"], v.body.items.slice(0, 10).map((x) => el("tr", {},
      el("td", {}, x.model), el("td", {}, x.version), el("td", {}, time(x.first_seen_at)),
      el("td", {class: "msg"}, Array.isArray(x.sources) ? x.sources.join(", ") : JSON.stringify(x.sources))))) : el("p", {class: "error"}, problem(v));
    section("policies", "Policies",
      el("p", {}, p.ok ? "every policy file is valid" : el("b", {class: "error"}, "some policy files are rejected")),
      table(["model", "version", "rules", "state", "validation errors"], models),
      errors.length ? el("ul", {class: "errors"}, errors) : null,
      el("h4", {}, "Versions"), versions);
  }
  async function renderShadow() {
    const r = await api("v1/shadow?since=7d");
    const models = r.ok && r.body && typeof r.body === "object" ? (r.body.models || r.body) : null;
    if (!models || !Object.keys(models).length) {
      section("shadow", "Shadow mode", el("p", {id: "shadow-none"}, r.ok || r.status === 404 ? "no shadow data" : problem(r)));
      return;
    }
    section("shadow", "Shadow mode (last 7 days)",
      table(["model", "window", "actual cost", "tidegate's cost", "saving", "lower capacity than needed", "misses covered"],
        Object.entries(models).map(([m, s]) => el("tr", {}, el("td", {}, m), el("td", {}, duration(s.window_s)),
          el("td", {class: "num"}, money(s.actual_cost)), el("td", {class: "num"}, money(s.shadow_cost)),
          el("td", {class: "num"}, `${money(s.saving)} (${fmt(s.saving_pct, 1)} %)`),
          el("td", {}, duration(s.under_capacity_s)), el("td", {}, duration(s.misses_covered_s))))));
  }

  // ---- refresh loop --------------------------------------------------------------------------
  async function refreshStatus() {
    const r = await api("v1/status");
    if (r.status === 401) {  // the session ended (expired cookie, token revoked): the server shows the login form
      window.location.reload();
      return false;
    }
    if (!r.ok) {
      section("fleet", "Fleet now", el("p", {class: "error"}, problem(r)));
      return false;
    }
    state.status = r.body;
    if (!state.model) state.model = Object.keys(r.body.models)[0] || null;
    const flags = document.getElementById("flags");
    flags.replaceChildren(...[el("span", {}, `daemon time ${time(r.body.at)}`),
      r.body.paused ? el("span", {class: "flag"}, "paused") : null,
      r.body.dry_run ? el("span", {class: "flag"}, "dry run") : null,
      journalFlag(r.body.journal, r.body.at)].filter((x) => x));
    renderFleet(r.body);
    return true;
  }
  async function refreshAll() {
    if (!(await refreshStatus())) return;
    await Promise.all([renderTimeline(), renderDecisions(), renderOverrides(), renderPolicies(), renderShadow()]);
    document.body.dataset.loaded = "1";
  }

  document.querySelector("header .who").textContent = `${WHO.name} (${WHO.role})`;
  // fixed order of the sections, whichever answer comes first
  document.getElementById("app").replaceChildren(
    ...["fleet", "timeline", "overrides", "decisions", "policies", "shadow"].map((id) => el("section", {id})));
  document.body.append(el("dialog", {id: "decision"},
    el("form", {method: "dialog"}, el("button", {type: "submit", class: "close"}, "Close")), el("div", {class: "body"})));
  refreshAll();
  setInterval(async () => {
    if (await refreshStatus()) await Promise.all([renderDecisions(), renderOverrides()]);
  }, REFRESH_MS);
  setInterval(renderTimeline, 6 * REFRESH_MS);
})();
