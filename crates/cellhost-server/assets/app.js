// cellhost dashboard. No framework, no CDN: everything the page needs is
// served by the daemon.
//
// Two views: the overview (live kernels, recent cells, a search box over
// sessions) and a session's page (#/session/NAME: its timeline, its files,
// interrupt and reset). The running cell's output comes live from the
// session's events stream when the daemon has one; without it the page
// asks only for cells newer than the last one it has.
//
// Every byte shown comes from cells and is hostile: cell text goes into the
// page as text nodes only (never innerHTML), images only as data: URLs of
// checked base64, HTML displays only inside an iframe sandboxed without
// scripts or same-origin.
"use strict";

const $ = (sel) => document.querySelector(sel);
const enc = encodeURIComponent;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const mib = n / (1024 * 1024);
  if (mib >= 1) return mib.toFixed(1) + " MiB";
  return n < 1024 ? n + " B" : (n / 1024).toFixed(0) + " KiB";
}

function seconds(s) {
  if (s < 1) return "0s";
  if (s < 120) return Math.round(s) + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}

// ---- The API: every request the page makes goes through here, with the
// page's own credentials (the cookie `/?token=` set), so the page sees
// exactly what its token may see.

async function failure(r) {
  let msg = r.status + "";
  try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
  const e = new Error(msg);
  e.status = r.status;
  return e;
}

const api = {
  async get(path) {
    const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
    if (!r.ok) throw await failure(r);
    return r.json();
  },
  // A state change: `X-Cellhost: 1` lets the cookie authorize it.
  async change(method, path) {
    const r = await fetch(path, { method, credentials: "same-origin", headers: { "X-Cellhost": "1" } });
    if (!r.ok) throw await failure(r);
    return r.json();
  },
  kernels() { return api.get("/v1/kernels"); },
  recent(after, limit, preview) {
    return api.get("/v1/history?limit=" + limit + "&max_bytes=1048576&preview=" + preview +
      (after === null ? "" : "&after=" + after));
  },
  async cells(session, after) {
    try {
      return await api.get("/v1/sessions/" + enc(session) + "/history?limit=100&max_bytes=8388608" +
        (after === null ? "" : "&after=" + after));
    } catch (e) {
      if (e.status === 404) return []; // nothing recorded yet
      throw e;
    }
  },
  files(session) {
    return api.get("/v1/sessions/" + enc(session) + "/files?recursive=true&limit=500");
  },
  fileUrl(session, path) {
    return "/v1/sessions/" + enc(session) + "/files/" + path.split("/").map(enc).join("/");
  },
  events(session, since) {
    return new EventSource("/v1/sessions/" + enc(session) + "/events" +
      (since === null ? "" : "?since=" + since));
  },
  interrupt(owner) {
    return api.change("POST", "/v1/sessions/" + enc(sessionOf(owner)) + "/interrupt");
  },
  reset(owner) {
    const sep = owner.indexOf("::child::");
    return api.change("DELETE", sep < 0 ? "/v1/sessions/" + enc(owner)
      : "/v1/sessions/" + enc(owner.slice(0, sep)) + "/children/" + enc(owner.slice(sep + 9)));
  },
};

function sessionOf(owner) {
  const sep = owner.indexOf("::child::");
  return sep < 0 ? owner : owner.slice(0, sep);
}

// ---- Names: an MCP session is its client's name and a short id.

const clients = new Map(); // session -> MCP client name, as the API said
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function noteClient(session, client) {
  if (client && clients.get(session) !== client) {
    clients.set(session, client);
    recentDirty = true;
  }
}

function nameOf(session) {
  const client = clients.get(session);
  const short = session.length > 12 ? session.slice(0, 8) : session;
  if (client) return client + " · " + short;
  if (UUID.test(session)) return "MCP · " + short;
  return session;
}

function matches(session) {
  const q = $("#search").value.trim().toLowerCase();
  if (!q) return true;
  return session.toLowerCase().includes(q) || nameOf(session).toLowerCase().includes(q);
}

function sessionLink(session) {
  return el("a", { href: "#/session/" + enc(session), class: "session-link", title: session }, nameOf(session));
}

async function act(owner, what) {
  try {
    await (what === "reset" ? api.reset(owner) : api.interrupt(owner));
    $("#status").textContent = what + " sent";
  } catch (e) {
    $("#status").textContent = what + " failed: " + e.message;
  }
  refresh();
}

function button(label, owner, what) {
  const b = el("button", { type: "button", class: "act", "data-act": what }, label);
  b.addEventListener("click", () => act(owner, what));
  return b;
}

// ---- Output: long text collapsed, displays rendered inertly.

const COLLAPSE_LINES = 40;

function output(text, cls) {
  const lines = text.split("\n");
  const pre = el("pre", { class: cls });
  if (lines.length <= COLLAPSE_LINES) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = lines.slice(0, COLLAPSE_LINES).join("\n");
  pre.dataset.collapsed = "true";
  const more = el("button", { type: "button", class: "show-all" },
    "show all " + lines.length + " lines");
  more.addEventListener("click", () => {
    pre.textContent = text;
    pre.dataset.collapsed = "false";
    more.remove();
  });
  return el("div", { class: "collapsible" }, pre, more);
}

// Live output: appended as it comes, collapsed the same way once long.
function liveOutput(box, cls) {
  let text = "";
  return (chunk) => {
    text += chunk;
    box.replaceChildren(output(text, cls));
  };
}

const IMAGES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const BASE64 = /^[A-Za-z0-9+/=\s]*$/;

function utf8Base64(text) {
  const b = new TextEncoder().encode(text);
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

// One display (its items share `display`): the richest form we can show
// safely.
function renderDisplay(items) {
  const by = new Map(items.map((d) => [d.mime, d.data]));
  for (const mime of IMAGES) {
    const data = by.get(mime);
    if (data !== undefined && BASE64.test(data)) {
      const img = el("img", { class: "display-image", alt: by.get("text/plain") || mime });
      img.src = "data:" + mime + ";base64," + data.replace(/\s/g, "");
      return img;
    }
  }
  if (by.has("image/svg+xml")) {
    // As an image, an SVG runs no script.
    const img = el("img", { class: "display-image", alt: "svg" });
    img.src = "data:image/svg+xml;base64," + utf8Base64(by.get("image/svg+xml"));
    return img;
  }
  if (by.has("text/html")) {
    // No allow-scripts, no allow-same-origin: the HTML is drawn and
    // nothing in it runs or reaches this page.
    const f = el("iframe", { class: "display-html", sandbox: "", referrerpolicy: "no-referrer", title: "HTML display" });
    f.srcdoc = by.get("text/html");
    return f;
  }
  for (const mime of ["text/markdown", "text/plain", "text/latex", "application/json"]) {
    if (by.has(mime)) return output(by.get(mime), "out display-text");
  }
  return el("pre", { class: "muted" }, "[display: " + items.map((d) => d.mime).join(", ") + "]");
}

function renderDisplays(displays) {
  const groups = new Map();
  for (const d of displays || []) {
    if (!groups.has(d.display)) groups.set(d.display, []);
    groups.get(d.display).push(d);
  }
  return [...groups.values()].map((items) => el("div", { class: "display" }, renderDisplay(items)));
}

function notes(c) {
  const out = [];
  if (c.state_reset) out.push(el("div", { class: "note" }, "state reset: this cell started in a fresh kernel"));
  if (c.state_lost) out.push(el("div", { class: "note warn" }, "state lost: earlier variables are gone"));
  if (c.note) out.push(el("div", { class: "note" }, c.note));
  return out;
}

function cellMeta(c) {
  return el("div", { class: "meta" },
    el("span", { class: "count" }, "[" + c.execution_count + "]"), " ",
    el("span", { class: "status" }, c.status), " · " +
    (c.duration_seconds * 1000).toFixed(1) + " ms · " +
    new Date(c.started_at * 1000).toLocaleTimeString() +
    (c.child ? " · child " + c.child : "") + (c.client ? " · " + c.client : ""));
}

// A finished cell of the history, notebook-like.
function renderCell(c) {
  return el("div", { class: "cell " + c.status, "data-cell": c.id },
    cellMeta(c),
    el("pre", { class: "code" }, c.code),
    c.stdout ? output(c.stdout, "out") : null,
    ...renderDisplays(c.displays),
    c.value ? output("Out: " + c.value, "out value") : null,
    c.stderr ? output(c.stderr, "err") : null,
    c.error ? output(c.error, "err error") : null,
    ...notes(c),
  );
}

// ---- The overview.

function renderKernels(kernels) {
  for (const k of kernels) noteClient(sessionOf(k.owner), k.client);
  const shown = kernels.filter((k) => matches(sessionOf(k.owner)));
  $("#kernels tbody").replaceChildren(...shown.map((k) => el("tr", { "data-owner": k.owner },
    el("td", {}, sessionLink(sessionOf(k.owner)),
      k.owner.includes("::child::") ? " › " + k.owner.slice(k.owner.indexOf("::child::") + 9) : null),
    el("td", { class: "state-" + k.state }, k.state + (k.queued ? " (+" + k.queued + " queued)" : "")),
    el("td", {}, seconds(k.idle_seconds)),
    el("td", {}, bytes(k.rss_bytes)),
    el("td", {}, k.execution_count),
    el("td", {}, k.pid ?? "–"),
    el("td", { class: "muted" }, k.id || "starting"),
    el("td", {}, k.state === "busy" ? button("interrupt", k.owner, "interrupt") : null,
      button("reset", k.owner, "reset")),
  )));
  $("#kernel-count").textContent = "(" + kernels.length + ")";
  $("#no-kernels").hidden = kernels.length > 0;
}

function renderRecent(cells) {
  const bySession = new Map();
  for (const c of cells) {
    noteClient(c.session, c.client);
    if (!bySession.has(c.session)) bySession.set(c.session, []);
    bySession.get(c.session).push(c);
  }
  const groups = [...bySession.entries()]
    .filter(([session]) => matches(session))
    .sort((a, b) => b[1][b[1].length - 1].id - a[1][a[1].length - 1].id);
  $("#sessions").replaceChildren(...groups.map(([session, list]) => el("div", { class: "session", "data-session": session },
    el("h3", {}, sessionLink(session), " ", el("span", { class: "muted" }, list.length + " cell(s)")),
    ...list.slice(-SHOWN).reverse().map(renderCell),
  )));
  $("#no-cells").hidden = cells.length > 0;
}

// Cells kept and shown (the last SHOWN per session), and the preview size.
const KEEP = 200, SHOWN = 10, PREVIEW = 2000;
let recent = [];
let recentDirty = true;

async function refreshOverview() {
  const last = recent.length ? recent[recent.length - 1].id : null;
  const [kernels, fresh] = await Promise.all([
    api.kernels(),
    api.recent(last, KEEP, PREVIEW).catch(() => []),
  ]);
  if (fresh.length) { recent = recent.concat(fresh).slice(-KEEP); recentDirty = true; }
  renderKernels(kernels);
  // Redrawn only when something changed (its displays' frames would
  // flicker otherwise).
  if (recentDirty) { renderRecent(recent); recentDirty = false; }
}

// ---- A session's page.

let page = null; // { session, cells: [], last, stream, running }

function openSession(session) {
  closeSession();
  page = { session, last: null, stream: null, running: null, polling: true, filesAt: 0 };
  $("#timeline").replaceChildren();
  $("#files tbody").replaceChildren();
  $("#file-images").replaceChildren();
  $("#session-name").textContent = nameOf(session);
  $("#session-id").textContent = "session " + session;
  $("#interrupt").onclick = () => act(session, "interrupt");
  $("#reset").onclick = () => act(session, "reset");
  connectEvents(page);
}

function closeSession() {
  if (page && page.stream) page.stream.close();
  page = null;
}

// The events stream, when the daemon has it: the running cell live.
// Without it (or while it is down) the page polls for new cells only.
function connectEvents(p) {
  if (typeof EventSource === "undefined") return;
  const s = api.events(p.session, null);
  p.stream = s;
  const data = (ev) => { try { return JSON.parse(ev.data); } catch (_) { return {}; } };
  s.addEventListener("open", () => { p.polling = false; $("#live").textContent = "live"; });
  s.addEventListener("error", () => {
    if (s.readyState === EventSource.CLOSED) { p.polling = true; $("#live").textContent = ""; }
  });
  s.addEventListener("cell_started", (ev) => startRunning(p, data(ev)));
  for (const kind of ["stdout", "stderr"]) {
    s.addEventListener(kind, (ev) => {
      const d = data(ev);
      const r = running(p, d.execution_count);
      if (r && typeof d.text === "string") r[kind](d.text);
    });
  }
  s.addEventListener("display", (ev) => {
    const d = data(ev);
    const r = running(p, d.execution_count);
    // One event per item; the items of one display (a PNG and its text
    // fallback) are drawn together, as the richest one.
    const items = d.display ? (Array.isArray(d.display) ? d.display : [d.display]) : (d.items || []);
    if (!r) return;
    for (const item of items) {
      const key = item.display ?? 0;
      if (!r.items.has(key)) r.items.set(key, { list: [], node: null });
      const g = r.items.get(key);
      g.list.push(item);
      const node = el("div", { class: "display" }, renderDisplay(g.list));
      if (g.node) g.node.replaceWith(node); else r.displays.append(node);
      g.node = node;
    }
  });
  s.addEventListener("cell_finished", () => { refreshSession(); });
  s.addEventListener("kernel", (ev) => {
    const d = data(ev);
    $("#live").textContent = "live · kernel " + (d.change || "") + (d.note ? ": " + d.note : "");
    refreshSession();
  });
  s.addEventListener("dropped", () => {
    // Fell behind: the history has what was missed.
    s.close();
    p.polling = true;
    refreshSession().then(() => { if (page === p) connectEvents(p); });
  });
}

function startRunning(p, d) {
  if (p.running) p.running.box.remove();
  const box = el("div", { class: "cell running", "data-running": d.execution_count },
    el("div", { class: "meta" }, "[" + d.execution_count + "] running" +
      (d.front_end ? " · " + d.front_end : "") +
      (d.started_at ? " · since " + new Date(d.started_at * 1000).toLocaleTimeString() : "")),
    el("pre", { class: "code" }, d.code || ""));
  const out = el("div", { class: "live-out" }), err = el("div", { class: "live-err" });
  const displays = el("div", { class: "live-displays" });
  box.append(out, displays, err);
  $("#timeline").prepend(box);
  $("#no-timeline").hidden = true;
  $("#session-state").textContent = "· busy";
  $("#interrupt").disabled = false;
  p.running = { count: d.execution_count, box, displays, items: new Map(), stdout: liveOutput(out, "out"), stderr: liveOutput(err, "err") };
}

function running(p, count) {
  return p.running && (count === undefined || p.running.count === count) ? p.running : null;
}

async function refreshFiles(p) {
  let listing;
  try { listing = await api.files(p.session); } catch (e) {
    $("#no-files").hidden = false;
    $("#no-files").textContent = "Files: " + e.message;
    return;
  }
  const files = (listing.entries || []).filter((f) => f.type === "file");
  $("#files tbody").replaceChildren(...files.map((f) => el("tr", { "data-path": f.path },
    el("td", {}, el("a", { href: api.fileUrl(p.session, f.path), download: f.name, class: "file-link" }, f.path)),
    el("td", {}, bytes(f.size)),
    el("td", { class: "muted" }, new Date(f.modified * 1000).toLocaleString()),
  )));
  $("#files-count").textContent = "(" + files.length + (listing.truncated ? "+" : "") + ")";
  $("#no-files").hidden = files.length > 0;
  $("#no-files").textContent = "No files in this session's workspace.";
  const images = files.filter((f) => /\.(png|jpe?g|gif|webp|svg)$/i.test(f.name) && f.size <= 8 << 20);
  $("#file-images").replaceChildren(...images.slice(0, 24).map((f) => el("figure", { class: "file-image" },
    (() => { const i = el("img", { alt: f.path }); i.src = api.fileUrl(p.session, f.path); return i; })(),
    el("figcaption", {}, f.path))));
}

async function refreshSession() {
  const p = page;
  if (!p) return;
  const [kernels, fresh] = await Promise.all([api.kernels(), api.cells(p.session, p.last)]);
  if (page !== p) return;
  for (const k of kernels) noteClient(sessionOf(k.owner), k.client);
  for (const c of fresh) noteClient(c.session, c.client);
  $("#session-name").textContent = nameOf(p.session);
  const mine = kernels.filter((k) => sessionOf(k.owner) === p.session);
  const busy = mine.some((k) => k.state === "busy");
  $("#session-state").textContent = mine.length ? "· " + mine.map((k) => k.state).join(", ") : "· no live kernel";
  $("#interrupt").disabled = !busy;
  $("#reset").disabled = mine.length === 0;
  if (fresh.length) {
    p.last = fresh[fresh.length - 1].id;
    if (p.running) { p.running.box.remove(); p.running = null; }
    // Newest first, like the overview.
    $("#timeline").prepend(...fresh.slice().reverse().map(renderCell));
  }
  $("#no-timeline").hidden = $("#timeline").children.length > 0;
  const now = Date.now();
  if (fresh.length || now - p.filesAt > 5000) {
    p.filesAt = now;
    await refreshFiles(p);
  }
}

// ---- Routing and the refresh loop.

function route() {
  const m = location.hash.match(/^#\/session\/(.+)$/);
  let session = null;
  try { session = m ? decodeURIComponent(m[1]) : null; } catch (_) { /* a malformed link: the overview */ }
  $("#overview").hidden = session !== null;
  $("#session-page").hidden = session === null;
  if (session === null) { closeSession(); recentDirty = true; }
  else if (!page || page.session !== session) openSession(session);
  refresh();
}

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    if (page) await refreshSession(); else await refreshOverview();
    $("#status").textContent = "live · updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("#status").textContent = "cannot reach the server: " + e.message;
  } finally {
    busy = false;
  }
}

// The overview and a session without its events stream poll (for what
// changed only); a session page with the stream refreshes on its events
// and every few seconds for kernel state and files.
let ticks = 0;
setInterval(() => {
  ticks += 1;
  if (!page || page.polling || ticks % 5 === 0) refresh();
}, 1000);

$("#search").addEventListener("input", () => {
  if (page) location.hash = "#/";
  else { recentDirty = true; refresh(); }
});
window.addEventListener("hashchange", route);
route();
