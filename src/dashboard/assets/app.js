// nthpool dashboard: fetches /api/pools or /api/pools/{pool} every second
// and builds the page with DOM calls and textContent only (never innerHTML).
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 4000;
const TOKEN_KEY = "nthpool-admin-token";
const SVG = "http://www.w3.org/2000/svg";

const STATUS_TEXT = {
  ok: "ok",
  concurrency: "limited by concurrency",
  rate: "limited by rate budget",
  cooldown: "cooling down",
  recovering: "recovering",
  draining: "draining (removed by a reload)",
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function fmtTime(epochMs) {
  return new Date(epochMs).toLocaleTimeString();
}

function orDash(v) {
  return v === null || v === undefined ? "—" : v;
}

function statusBadge(status) {
  return el("span", { class: "status status-" + status, "data-status": status }, STATUS_TEXT[status] || status);
}

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  // A connection that went silent (a network that dropped, a server that
  // stopped answering) would keep a fetch pending for minutes and the page
  // frozen: it is given up after FETCH_TIMEOUT_MS and asked again next tick.
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  try {
    const res = await fetch(path, { headers, cache: "no-store", credentials: "omit", signal: abort.signal });
    if (res.status === 401 || res.status === 404) {
      const err = new Error(res.status === 401 ? "unauthorized" : "not found");
      err.unauthorized = res.status === 401;
      err.notFound = res.status === 404;
      throw err;
    }
    if (!res.ok) throw new Error(await refusal(res, path));
    return await res.json();
  } catch (e) {
    if (abort.signal.aborted) throw new Error("no answer within " + FETCH_TIMEOUT_MS / 1000 + " s");
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

// Why a request was refused: the server's own sentence (every admin refusal
// is JSON with one, such as what to do about a 403 forbidden_host), else
// the status alone.
async function refusal(res, path) {
  try {
    const body = await res.json();
    if (body && typeof body.message === "string") return body.message + " (HTTP " + res.status + ")";
  } catch (e) {
    // Not JSON (a page of a proxy in between): the status says what there is.
  }
  return "HTTP " + res.status + " from " + path;
}

// ---- pools at a glance ----

// The index is built once per set of pools and then updated cell by cell:
// with thousands of pools, rebuilding the table every second would cost the
// tab most of a core.
let indexView = null;

// The seven cells of a pool's row after its name, as text (the status as its key).
function indexCells(p) {
  return [p.status, p.held, p.effectiveLimit, p.limit, p.queueDepth + " / " + p.queueSize, orDash(p.rpmTokens),
    p.cooldownMs > 0 ? fmtMs(p.cooldownMs) : "—"];
}

function buildIndex(pools, names) {
  const rows = new Map();
  const fields = [null, "held", "effectiveLimit", "limit", "queueDepth", null, null];
  const trs = pools.map((p) => {
    const cells = fields.map((field, i) => el("td", { class: i > 0 ? "num" : null, "data-field": field }));
    rows.set(p.name, { cells, shown: [] });
    return el("tr", { "data-pool": p.name },
      el("th", { scope: "row" }, el("a", { href: "/pools/" + encodeURIComponent(p.name) }, p.name)), ...cells);
  });
  const table = el("table", { id: "pools" },
    el("caption", { class: "muted" }, "Live state, refreshed every second."),
    el("thead", {}, el("tr", {},
      el("th", { scope: "col" }, "Pool"), el("th", { scope: "col" }, "Status"),
      el("th", { scope: "col", class: "num" }, "Held"), el("th", { scope: "col", class: "num" }, "Effective limit"),
      el("th", { scope: "col", class: "num" }, "Configured limit"), el("th", { scope: "col", class: "num" }, "Queue"),
      el("th", { scope: "col", class: "num" }, "RPM tokens"), el("th", { scope: "col", class: "num" }, "Cool-down left"))),
    el("tbody", {}, ...trs));
  return { names, rows, nodes: [el("h1", {}, "Pools"), el("div", { class: "table-wrap" }, table)] };
}

function renderIndex(data) {
  const names = data.pools.map((p) => p.name).join("\n");
  if (!indexView || indexView.names !== names) indexView = buildIndex(data.pools, names);
  for (const p of data.pools) {
    const row = indexView.rows.get(p.name);
    indexCells(p).forEach((text, i) => {
      if (row.shown[i] === text) return;
      row.shown[i] = text;
      if (i === 0) row.cells[0].replaceChildren(statusBadge(text));
      else row.cells[i].textContent = String(text);
    });
  }
  return indexView.nodes;
}

// ---- one pool's Overview ----

function facts(id, items) {
  return el("dl", { class: "facts", id },
    ...items.map(([label, value, field]) =>
      el("div", {}, el("dt", {}, label), el("dd", field ? { "data-field": field } : {}, value))));
}

const CHARTS = [
  { id: "chart-grants", title: "Grants per second", series: [["grants", "grants", "c1"]] },
  { id: "chart-denials", title: "Denials per second, by reason", series: [
    ["deniedConcurrency", "concurrency", "c1"], ["deniedRate", "rate", "c2"],
    ["deniedCooldown", "cool-down", "c3"], ["deniedQueueFull", "queue full", "c4"],
    ["deniedRecovering", "recovering", "c5"]] },
  { id: "chart-throttled", title: "Upstream throttling reported per second", series: [["throttled", "throttled reports", "c2"]] },
  { id: "chart-limits", title: "Effective vs configured limit", series: [
    ["effectiveLimit", "effective", "c1"], ["limit", "configured", "c3 dashed"]] },
  { id: "chart-held", title: "Slots held", series: [["held", "held", "c1"]] },
  { id: "chart-queue", title: "Queue depth", series: [["queueDepth", "waiting", "c4"]] },
];

function chart(spec, history) {
  const W = 900, H = 100;
  const n = history.grants.length;
  let peak = 0;
  for (const [key] of spec.series) for (const v of history[key]) peak = Math.max(peak, v);
  // The scale of a chart of zeros is 1 all the same; its peak says 0.
  const max = Math.max(peak, 1);
  const node = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  const title = svg("title");
  title.textContent = `${spec.title}, last ${n} s, peak ${peak}`;
  node.append(title, svg("line", { x1: 0, y1: H, x2: W, y2: H, class: "axis" }));
  for (const [key, , cls] of spec.series) {
    const values = history[key];
    const x0 = W - values.length;
    const points = values.map((v, i) => `${x0 + i},${(H - (v / max) * (H - 4)).toFixed(1)}`).join(" ");
    node.append(svg("polyline", { points, class: cls, "data-series": key }));
  }
  const legend = el("ul", { class: "legend" },
    ...spec.series.map(([, label, cls]) => el("li", {}, el("span", { class: "key " + cls }), label)),
    el("li", {}, `peak ${peak}`));
  const axis = el("p", { class: "time-axis", "aria-hidden": "true" }, el("span", {}, "15 min ago"), el("span", {}, "now"));
  return el("figure", { class: "chart", id: spec.id }, el("figcaption", {}, spec.title), node, axis, legend);
}

function copyButton(text, label) {
  const button = el("button", { type: "button", "aria-label": "Copy: " + label }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch (e) {
      button.textContent = "Select and copy";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return button;
}

function renderPool(data) {
  const p = data.pool, c = data.config, h = data.history;
  const budget = data.budget;
  const out = [
    el("p", {}, el("a", { href: "/" }, "← All pools")),
    el("h1", {}, "Pool ", el("code", {}, p.name), " ", statusBadge(p.status)),
    el("h2", {}, "Live state"),
    facts("live", [
      ["Held", p.held, "held"],
      ["Effective limit", p.effectiveLimit, "effectiveLimit"],
      ["Configured limit", p.limit, "limit"],
      ["Queue", p.queueDepth + " / " + p.queueSize, "queueDepth"],
      ["RPM tokens", orDash(p.rpmTokens), "rpmTokens"],
      ["Cool-down left", p.cooldownMs > 0 ? fmtMs(p.cooldownMs) : "none", "cooldown"],
      ["Learned budget", budget ? budget.remaining : "none learned", "budget"],
      ["Budget resets", budget ? fmtTime(budget.resetAt) : "—", "budgetReset"],
      ["Token window", data.tokenBlockedUntil ? "spent until " + fmtTime(data.tokenBlockedUntil) : "—", "tokenBlock"],
    ]),
    el("h2", {}, "Last 15 minutes"),
    el("div", { class: "charts" }, ...CHARTS.map((spec) => chart(spec, h))),
    el("h2", {}, "Latest acquire attempts"),
    attemptsTable(data.attempts),
    el("h2", {}, "Configuration"),
    facts("config", [
      ["Concurrency", c.concurrency],
      ["Queue size", c.queueSize],
      ["Queue timeout", fmtMs(c.queueTimeoutMs)],
      ["RPM", c.rpm === null ? "no limit" : c.rpm + " (burst " + c.rpmBurst + ")"],
      ["Lease term", fmtMs(c.termMs)],
      ["Renew interval", fmtMs(c.renewIntervalMs)],
      ["Request timeout", fmtMs(c.requestTimeoutMs)],
      ["Adaptive", c.adaptive ? "yes" : "no"],
      ["Public host", orDash(c.publicHost), "publicHost"],
    ]),
  ];
  return out;
}

// The Examples only change with the configuration; they are rebuilt only
// then, so a selection or a focused copy button survives the refreshes.
function renderExamples(data) {
  return [
    el("h2", { id: "examples" }, "Examples"),
    el("p", { class: "muted" }, "Set POOL_KEY to one of this pool's keys first: export POOL_KEY='…'. An acquire sets SLOT_ID to its grant's slotId, for the renew and release pasted after it."),
    ...data.examples.map((x) =>
      el("section", { class: "example", id: "example-" + x.id, "aria-labelledby": "example-title-" + x.id },
        el("div", { class: "example-head" }, el("h3", { id: "example-title-" + x.id }, x.title), copyButton(x.text, x.title)),
        el("pre", {}, el("code", {}, x.text)))),
    // Proxy usage examples join here once the pool can have an upstream.
    el("div", { id: "proxy-examples" }),
  ];
}

// The wait the server applied (the asked one clamped to the queue timeout);
// one that differs from what the client asked says so on hover.
function waitCell(a) {
  const clamped = a.appliedWaitMs !== a.waitMs;
  return el("td", {
    "data-field": "wait",
    class: clamped ? "clamped" : null,
    title: clamped ? "asked " + fmtMs(a.waitMs) + ", clamped to the queue timeout" : null,
  }, fmtMs(a.appliedWaitMs));
}

function attemptsTable(attempts) {
  if (attempts.length === 0) return el("p", { class: "muted", id: "attempts" }, "No acquire attempts yet.");
  return el("div", { class: "table-wrap" }, el("table", { id: "attempts" },
    el("thead", {}, el("tr", {},
      ...["Time", "Status", "Error", "Reason", "Wait", "Queued", "Server time", "Slot ref"]
        .map((t) => el("th", { scope: "col" }, t)))),
    el("tbody", {}, ...attempts.map((a) => el("tr", {},
      el("td", {}, fmtTime(a.time)), el("td", {}, a.status), el("td", {}, orDash(a.error)),
      el("td", {}, orDash(a.denyReason)), waitCell(a), el("td", {}, fmtMs(a.queuedMs)),
      el("td", {}, a.serverUs + " µs"), el("td", {}, orDash(a.slotRef)))))));
}

// ---- routing, polling, login ----

function route() {
  const m = location.pathname.match(/^\/pools\/([^/]+)$/);
  if (m) {
    let name = m[1];
    try {
      name = decodeURIComponent(name);
    } catch (e) {
      // Not valid percent-encoding: shown as typed.
    }
    return { api: "/api/pools/" + m[1], render: renderPool, still: renderExamples, pool: name,
      title: "nthpool · " + name };
  }
  return { api: "/api/pools", render: renderIndex, inPlace: true, still: null, title: "nthpool · pools" };
}

// The pool of this page does not exist (a mistyped address, or removed by
// a reload): said in the page, which keeps asking in case a reload adds it.
function showNotFound(r) {
  stillKey = null;
  document.title = "nthpool · no such pool";
  document.getElementById("view").replaceChildren(
    el("h1", { id: "not-found" }, "No such pool"),
    el("p", {}, "This server has no pool named ", el("code", {}, r.pool), "."),
    el("p", {}, el("a", { href: "/" }, "← All pools")));
}

function showLogin(message) {
  // The page is emptied: whatever signs in next draws the examples again.
  stillKey = null;
  document.getElementById("login").hidden = false;
  document.getElementById("view").replaceChildren();
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("token").focus();
}

let stillKey = null;

// Brings `target` to look like `source`, a node just drawn, changing only
// what differs: a node that stays as it was is kept, so focus and a
// selection in it survive the refresh (the back link, the configuration,
// any number that did not change).
function patch(target, source) {
  if (target.nodeType !== source.nodeType || target.nodeName !== source.nodeName) {
    target.replaceWith(source);
    return;
  }
  if (target.nodeType !== Node.ELEMENT_NODE) {
    if (target.nodeValue !== source.nodeValue) target.nodeValue = source.nodeValue;
    return;
  }
  for (const { name } of [...target.attributes]) if (!source.hasAttribute(name)) target.removeAttribute(name);
  for (const { name, value } of [...source.attributes]) {
    if (target.getAttribute(name) !== value) target.setAttribute(name, value);
  }
  patchChildren(target, [...source.childNodes]);
}

function patchChildren(target, sources) {
  while (target.childNodes.length > sources.length) target.lastChild.remove();
  sources.forEach((source, i) => {
    const old = target.childNodes[i];
    if (old) patch(old, source);
    else target.append(source);
  });
}

async function tick(r) {
  try {
    const data = await api(r.api);
    document.getElementById("login").hidden = true;
    const view = document.getElementById("view");
    let live = document.getElementById("live-part");
    let still = document.getElementById("still-part");
    if (!live) {
      live = el("div", { id: "live-part" });
      still = el("div", { id: "still-part" });
      view.replaceChildren(live, still);
    }
    document.title = r.title;
    const nodes = r.render(data);
    // A view updated in place is already there, or put there whole once it
    // is built anew (copied over the old one, its nodes would be moved out
    // of the view, which updates them, by the copy itself). A view drawn
    // anew every time is brought onto the one shown, changing only what differs.
    if (nodes.length !== live.childNodes.length || nodes.some((n, i) => live.childNodes[i] !== n)) {
      if (r.inPlace) live.replaceChildren(...nodes);
      else patchChildren(live, nodes);
    }
    if (r.still) {
      const key = JSON.stringify(data.examples);
      if (stillKey !== key) {
        still.replaceChildren(...r.still(data));
        stillKey = key;
      }
    }
    document.getElementById("updated").textContent = "Updated " + fmtTime(data.serverTime);
  } catch (e) {
    if (e.unauthorized) {
      showLogin(sessionStorage.getItem(TOKEN_KEY) ? "That token was not accepted." : "");
      return false;
    }
    if (e.notFound && r.pool !== undefined) {
      document.getElementById("login").hidden = true;
      showNotFound(r);
      document.getElementById("updated").textContent = "";
      return true;
    }
    document.getElementById("updated").textContent = "Not updated: " + e.message;
  }
  return true;
}

let timer = null;

async function start() {
  const r = route();
  document.title = r.title;
  if (timer) clearTimeout(timer);
  const loop = async () => {
    if (await tick(r)) timer = setTimeout(loop, POLL_MS);
  };
  loop();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
    document.getElementById("token").value = "";
    start();
  });
  start();
});
