"use strict";
// Disbatch web UI: plain JavaScript over the DCI's JSON API.

const $ = (sel) => document.querySelector(sel);
const STATUS = { "-7": "scheduled", "-6": "orphaned", "-5": "cancelled", "-4": "blocked", "-3": "terminated", "-2": "queued", "-1": "claimed", "0": "running", "1": "succeeded", "2": "failed" };
const PAGE = 25;
let plugins = [];
let refreshTimer = null;
// Each drawing of the view is a pass: begun by a navigation, a change or the auto-refresh,
// it draws once its answers are in. A pass draws only if the page is still where it began
// and no later pass has drawn; a refresh pass also gives way to an edit (inputs typed
// since it began, or a field of the view with the focus) rather than overwrite it.
let edits = 0;
let passes = 0;
let drawn = 0;
class Stale extends Error {}

function begin(refresh) {
  return { seq: ++passes, refresh, edits, hash: location.hash };
}

// The view's element, to be filled by `pass`; throws Stale when the pass must not draw.
function view(pass) {
  if (pass.seq < drawn || pass.hash !== location.hash) throw new Stale("a later view was drawn");
  if (pass.refresh && (edits !== pass.edits || editing())) throw new Stale("an edit began");
  drawn = pass.seq;
  return $("#view");
}

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function plain(v) {
  if (v && typeof v === "object" && ("$oid" in v)) return v.$oid;
  if (v && typeof v === "object" && ("$date" in v)) return new Date(v.$date).toLocaleString();
  return v ?? "-";
}
function say(text, kind = "info") {
  const m = $("#message");
  m.textContent = text;
  m.className = kind;
}

async function api(method, path, body) {
  // Our own answer shapes (404 for an unknown queue or node, dates as {"$date"}), not Disbatch 4's.
  const headers = { "Disbatch-Shape": "native" };
  const token = localStorage.getItem("disbatch-token");
  if (token && method !== "GET") headers["Authorization"] = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  let data;
  try { data = JSON.parse(text); } catch { data = text; }
  if (!resp.ok) throw new Error((data && data.error) || resp.statusText);
  return data;
}

function editing() {
  const a = document.activeElement;
  return a && ["INPUT", "SELECT", "TEXTAREA"].includes(a.tagName) && $("#view").contains(a);
}

// Sends a change; once it is made, the page is drawn again from the server. A refused change
// leaves the page as it is, with what was typed, to be corrected.
async function write(action, done) {
  try {
    await action();
  } catch (e) {
    say(e.message, "error");
    return;
  }
  say(done);
  await render();
}

// ---- shell --------------------------------------------------------------------------------

async function render(refresh = false) {
  const pass = begin(refresh);
  const hash = location.hash || "#/overview";
  const [path, query] = hash.slice(1).split("?");
  document.querySelectorAll("nav a").forEach((a) => {
    const on = hash === a.getAttribute("href") || hash.startsWith(a.getAttribute("href") + "?") || (a.id === "nav-overview" && !location.hash);
    a.classList.toggle("active", on);
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  });
  try {
    if (path.startsWith("/task/")) await showTask(pass, decodeURIComponent(path.slice(6)));
    else if (path.startsWith("/queue/")) await showQueue(pass, decodeURIComponent(path.slice(7)));
    else if (path === "/queues") await showQueues(pass);
    else if (path === "/nodes") await showNodes(pass);
    else if (path === "/tasks") await showTasks(pass, new URLSearchParams(query || ""));
    else if (path === "/schedules") await showSchedules(pass);
    else if (path === "/plugins") await showPlugins(pass);
    else if (path === "/balance") await showBalance(pass);
    else await showOverview(pass);
  } catch (e) {
    if (!(e instanceof Stale)) say(e.message, "error");
  }
  api("GET", "/monitoring").then((m) => {
    const h = $("#health");
    h.textContent = m.disbatch.status + ": " + m.disbatch.message +
      (m.queuebalance && !/disabled$/.test(m.queuebalance.message) ? " · balance " + m.queuebalance.status : "");
    h.className = "badge " + m.disbatch.status;
  }).catch(() => {});
}

function schedule() {
  clearInterval(refreshTimer);
  if ($("#autorefresh").checked) {
    refreshTimer = setInterval(() => {
      const draft = $("#balance-edit");
      const dirty = draft && draft.value !== draft.defaultValue;
      if (!editing() && !dirty && !$("#new-queue-dialog").open && !$("#new-task-dialog").open) render(true);
    }, 5000);
  }
}

async function start() {
  $("#token").value = localStorage.getItem("disbatch-token") || "";
  $("#token").addEventListener("change", () => localStorage.setItem("disbatch-token", $("#token").value));
  $("#autorefresh").addEventListener("change", schedule);
  document.addEventListener("input", (e) => { if ($("#view").contains(e.target)) edits++; }, true);
  $("#new-queue-cancel").onclick = () => $("#new-queue-dialog").close();
  $("#new-task-cancel").onclick = () => $("#new-task-dialog").close();
  $("#new-task-form").addEventListener("submit", submitTask);
  $("#new-queue-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { name: $("#new-queue-name").value, plugin: $("#new-queue-plugin").value, sort: $("#new-queue-sort").value };
    const threads = $("#new-queue-threads").value;
    if (threads !== "") body.threads = Number(threads);
    try {
      await api("POST", "/queues", body);
      $("#new-queue-dialog").close();
      say("created queue " + body.name);
    } catch (err) {
      say(err.message, "error");
    }
    await render();
  });
  try { plugins = await api("GET", "/plugins"); } catch (e) { say(e.message, "error"); }
  window.addEventListener("hashchange", () => render());
  await render();
  schedule();
}

start();
