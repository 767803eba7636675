// cellhost dashboard: polls the daemon's own API once a second. No
// framework, no CDN: everything the page needs is served by the daemon.
// The history is fetched incrementally (only cells newer than the last
// one seen, each text cut to a preview) and at most KEEP cells are kept:
// a poll costs what changed, not the whole history.
"use strict";

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
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
  return mib >= 1 ? mib.toFixed(1) + " MiB" : (n / 1024).toFixed(0) + " KiB";
}

function seconds(s) {
  if (s < 1) return "0s";
  if (s < 120) return Math.round(s) + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}

async function getJSON(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!r.ok) {
    let msg = r.status + "";
    try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return r.json();
}

// Interrupt or reset (dispose) one owner's kernel through the API.
async function act(owner, what) {
  const enc = encodeURIComponent;
  const sep = owner.indexOf("::child::");
  let method = "POST", path = "/v1/sessions/" + enc(owner) + "/interrupt";
  if (what === "reset") {
    method = "DELETE";
    path = sep < 0 ? "/v1/sessions/" + enc(owner)
      : "/v1/sessions/" + enc(owner.slice(0, sep)) + "/children/" + enc(owner.slice(sep + 9));
  }
  // X-Cellhost: 1 lets the dashboard cookie authorize this change.
  const r = await fetch(path, { method, credentials: "same-origin", headers: { "X-Cellhost": "1" } });
  if (!r.ok) {
    let msg = r.status + "";
    try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
    $("#status").textContent = what + " failed: " + msg;
  }
  refresh();
}

function button(label, owner, what) {
  const b = el("button", { type: "button", class: "act", "data-act": what }, label);
  b.addEventListener("click", () => act(owner, what));
  return b;
}

function renderKernels(kernels) {
  const body = $("#kernels tbody");
  body.replaceChildren(...kernels.map((k) => el("tr", { "data-owner": k.owner },
    el("td", {}, k.owner),
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

function renderCells(cells) {
  const bySession = new Map();
  for (const c of cells) {
    const who = c.child ? c.session + " › " + c.child : c.session;
    if (!bySession.has(who)) bySession.set(who, []);
    bySession.get(who).push(c);
  }
  const groups = [...bySession.entries()].sort((a, b) =>
    b[1][b[1].length - 1].id - a[1][a[1].length - 1].id);
  $("#sessions").replaceChildren(...groups.map(([who, list]) => el("div", { class: "session", "data-session": who },
    el("h3", {}, who),
    ...list.slice(-SHOWN).reverse().map((c) => el("div", { class: "cell " + c.status, "data-cell": c.id },
      el("div", { class: "meta" },
        "[" + c.execution_count + "] " + c.status + " · " + (c.duration_seconds * 1000).toFixed(1) + " ms · " +
        new Date(c.started_at * 1000).toLocaleTimeString() + (c.note ? " · " + c.note : "")),
      el("pre", { class: "code" }, c.code),
      c.stdout ? el("pre", { class: "out" }, c.stdout) : null,
      c.value ? el("pre", { class: "out" }, "Out: " + c.value) : null,
      c.stderr ? el("pre", { class: "err" }, c.stderr) : null,
      c.error ? el("pre", { class: "err" }, c.error) : null,
    )),
  )));
  $("#no-cells").hidden = cells.length > 0;
}

// Cells kept and shown (the last SHOWN per session), and the preview size.
const KEEP = 200, SHOWN = 10, PREVIEW = 2000;
let cells = [];

async function fetchCells() {
  const last = cells.length ? cells[cells.length - 1].id : null;
  const q = "limit=" + KEEP + "&max_bytes=1048576&preview=" + PREVIEW + (last === null ? "" : "&after=" + last);
  const fresh = await getJSON("/v1/history?" + q).catch(() => []);
  if (fresh.length) {
    cells = cells.concat(fresh).slice(-KEEP);
  }
  return cells;
}

async function refresh() {
  try {
    const [kernels, shown] = await Promise.all([
      getJSON("/v1/kernels"),
      fetchCells(),
    ]);
    renderKernels(kernels);
    renderCells(shown);
    $("#status").textContent = "live · updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("#status").textContent = "cannot reach the server: " + e.message;
  }
}

refresh();
setInterval(refresh, 1000);
