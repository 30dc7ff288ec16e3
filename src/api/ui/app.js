"use strict";
// Disbatch web UI: plain JavaScript over the DCI's JSON API.

const $ = (sel) => document.querySelector(sel);
const STATUS = { "-7": "scheduled", "-6": "orphaned", "-5": "cancelled", "-4": "blocked", "-3": "terminated", "-2": "queued", "-1": "claimed", "0": "running", "1": "succeeded", "2": "failed" };
const PAGE = 25;
let plugins = [];
let refreshTimer = null;

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

// ---- queues -------------------------------------------------------------------------------

async function showQueues() {
  const queues = await api("GET", "/queues");
  const rows = queues.map((q) => `
    <tr data-queue="${esc(q.name)}">
      <td>${esc(q.name)}<br><small>${esc(q.id)}</small>${q.problem ?
        `<div class="problem">cannot be read: ${esc(q.problem)}</div>` : ""}${(q.problems || []).map((p) =>
        `<div class="problem">cannot run on ${esc(p.node)}: ${esc(p.reason)}</div>`).join("")}</td>
      <td><select class="edit-plugin" data-id="${esc(q.id)}">${pluginOptions(q.plugin)}</select></td>
      <td><input class="edit-threads" type="number" min="0" data-id="${esc(q.id)}" value="${q.threads ?? ""}" placeholder="paused">${q.maxthreads != null ?
        `<br><small class="share" title="the QueueBalance's share of this queue now">balance share ${q.maxthreads}</small>` : ""}</td>
      <td>${esc(q.sort)}</td>
      <td class="num queued">${q.queued}</td><td class="num running">${q.running}</td><td class="num completed">${q.completed}</td>
      <td><a href="#/tasks?queue=${encodeURIComponent(q.name)}">tasks</a>
          <button class="new-task" data-name="${esc(q.name)}">new task</button>
          <button class="delete-queue" data-id="${esc(q.id)}" data-name="${esc(q.name)}">delete</button></td>
    </tr>`).join("");
  $("#view").innerHTML = `
    <div class="toolbar"><button id="new-queue">New queue</button></div>
    <table id="queues"><thead><tr><th>Queue</th><th>Plugin</th><th>Threads</th><th>Sort</th>
      <th>Queued</th><th>Running</th><th>Completed</th><th></th></tr></thead><tbody>${rows ||
      '<tr><td colspan="8">No queues yet.</td></tr>'}</tbody></table>`;
  $("#new-queue").onclick = openNewQueue;
  document.querySelectorAll(".edit-threads").forEach((el) => el.addEventListener("change", async () => {
    const threads = el.value === "" ? null : Number(el.value);
    await write(() => api("POST", "/queues/" + el.dataset.id, { threads }), "threads set to " + (threads ?? "null"));
  }));
  document.querySelectorAll(".edit-plugin").forEach((el) => el.addEventListener("change", async () => {
    await write(() => api("POST", "/queues/" + el.dataset.id, { plugin: el.value }), "plugin set to " + el.value);
  }));
  document.querySelectorAll(".new-task").forEach((el) => el.addEventListener("click", () => openNewTask(el.dataset.name)));
  document.querySelectorAll(".delete-queue").forEach((el) => el.addEventListener("click", async () => {
    if (!confirm("Delete queue " + el.dataset.name + "? Its tasks stay.")) return;
    await write(() => api("DELETE", "/queues/" + el.dataset.id), "deleted " + el.dataset.name);
  }));
}

function pluginOptions(selected) {
  const names = plugins.includes(selected) || !selected ? plugins : [selected, ...plugins];
  return names.map((p) => `<option${p === selected ? " selected" : ""}>${esc(p)}</option>`).join("");
}

async function write(action, done) {
  try {
    await action();
    say(done);
  } catch (e) {
    say(e.message, "error");
  }
  await render();
}

function openNewTask(queue) {
  $("#new-task-queue").textContent = queue;
  $("#new-task-dialog").showModal();
}

async function submitTask(e) {
  e.preventDefault();
  const queue = $("#new-task-queue").textContent;
  let params;
  try {
    params = JSON.parse($("#new-task-params").value);
  } catch (err) {
    say("params are not valid JSON: " + err.message, "error");
    return;
  }
  const list = Array.isArray(params) ? params : [params];
  const body = { queue, params: list };
  const runAt = $("#new-task-run-at").value.trim();
  if (runAt) body.run_at = runAt;
  try {
    const created = await api("POST", "/tasks", body);
    $("#new-task-dialog").close();
    say(`created ${created.count} task${created.count === 1 ? "" : "s"} in ${queue}`);
    location.hash = created.count === 1 ? "#/task/" + created.ids[0] : "#/tasks?queue=" + encodeURIComponent(queue);
  } catch (err) {
    say(err.message, "error");
  }
}

function openNewQueue() {
  $("#new-queue-plugin").innerHTML = pluginOptions(plugins[0]);
  $("#new-queue-name").value = "";
  $("#new-queue-dialog").showModal();
}

// ---- nodes --------------------------------------------------------------------------------

async function showNodes() {
  const nodes = await api("GET", "/nodes");
  const rows = nodes.map((n) => `
    <tr data-node="${esc(n.node)}">
      <td>${esc(n.node)}<br><small>${esc(n.id)}</small></td>
      <td><input class="edit-maxthreads" type="number" min="0" data-node="${esc(n.node)}" value="${n.maxthreads ?? ""}" placeholder="no limit"></td>
      <td>${plain(n.timestamp)} (${Math.round(n.age_secs)} s ago)</td>
      <td><span class="state ${n.fresh ? "fresh" : "stale"}">${n.fresh ? "fresh" : "stale"}</span>${n.leader ? ' <span class="state leader" title="holds the leader lease: the orphan sweep runs here">leader</span>' : ""}</td>
      <td><a href="#/tasks?node=${encodeURIComponent(n.node)}">tasks</a></td>
    </tr>`).join("");
  $("#view").innerHTML = `<table id="nodes"><thead><tr><th>Node</th><th>Maxthreads</th><th>Heartbeat</th><th>State</th><th></th></tr></thead>
    <tbody>${rows || '<tr><td colspan="5">No nodes have reported yet.</td></tr>'}</tbody></table>`;
  document.querySelectorAll(".edit-maxthreads").forEach((el) => el.addEventListener("change", async () => {
    const maxthreads = el.value === "" ? null : Number(el.value);
    await write(() => api("POST", "/nodes/" + encodeURIComponent(el.dataset.node), { maxthreads }), "maxthreads set to " + (maxthreads ?? "null"));
  }));
}

// ---- plugins ------------------------------------------------------------------------------

async function showPlugins() {
  const list = await api("GET", "/plugins?full=1");
  const rows = list.map((p) => `
    <tr data-plugin="${esc(p.name)}">
      <td>${esc(p.name)}</td><td>${esc(p.source)}</td><td>${p.allowed ? "yes" : "no"}</td><td>${p.versions}</td>
      <td><code title="${esc(p.sha256)}">${esc((p.sha256 || "-").slice(0, 12))}</code></td><td>${esc(p.size ?? "-")}</td>
      <td>${esc(p.wit ?? "-")}</td><td>${plain(p.uploaded)}</td><td>${esc(p.uploaded_by ?? "-")}</td>
      <td>${p.versions ? `<button class="delete-plugin" data-name="${esc(p.name)}">Delete</button>` : ""}</td>
    </tr>`).join("");
  $("#view").innerHTML = `
    <form class="toolbar" id="plugin-upload">
      <label>Component <input id="plugin-file" type="file" accept=".wasm,application/wasm" required></label>
      <label>Name <input id="plugin-name" placeholder="the file name without .wasm"></label>
      <button type="submit" id="plugin-push">Upload</button>
    </form>
    <table id="plugins"><thead><tr><th>Plugin</th><th>Source</th><th>Allowed</th><th>Versions</th><th>SHA-256</th>
      <th>Size</th><th>WIT</th><th>Uploaded</th><th>By</th><th></th></tr></thead>
    <tbody>${rows || '<tr><td colspan="10">No plugins.</td></tr>'}</tbody></table>`;
  $("#plugin-file").addEventListener("change", () => {
    const f = $("#plugin-file").files[0];
    if (f && !$("#plugin-name").value) $("#plugin-name").value = f.name.replace(/\.wasm$/, "");
  });
  $("#plugin-upload").addEventListener("submit", async (e) => {
    e.preventDefault();
    const file = $("#plugin-file").files[0];
    const name = $("#plugin-name").value.trim() || file.name.replace(/\.wasm$/, "");
    say("uploading " + name + "…");
    try { say(await upload(name, file)); } catch (err) { say(err.message, "error"); }
    await render();
  });
  document.querySelectorAll(".delete-plugin").forEach((el) => el.addEventListener("click", async () => {
    if (!confirm("Delete every stored version of " + el.dataset.name + "?")) return;
    await write(() => api("DELETE", "/plugins/" + encodeURIComponent(el.dataset.name)), "deleted " + el.dataset.name);
  }));
}

// Sends a component with its SHA-256, so a damaged upload is refused.
async function upload(name, file) {
  const bytes = await file.arrayBuffer();
  const q = new URLSearchParams({ name });
  if (crypto.subtle) {
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    q.set("sha256", Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join(""));
  }
  const headers = { "Content-Type": "application/wasm", "X-Disbatch-User": "web UI" };
  const token = localStorage.getItem("disbatch-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const resp = await fetch("/plugins?" + q, { method: "POST", headers, body: bytes });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  plugins = await api("GET", "/plugins");
  return (data.created ? "uploaded " : "already stored, now the newest: ") + data.ref + (data.allowed ? "" : " (not in the allowlist)");
}

// ---- tasks --------------------------------------------------------------------------------

async function showTasks(params) {
  const queues = await api("GET", "/queues");
  const queue = params.get("queue") || "";
  const status = params.get("status") || "";
  const node = params.get("node") || "";
  const skip = Number(params.get("skip") || 0);
  const q = new URLSearchParams({ limit: PAGE, skip });
  if (queue) q.set("queue", queue);
  if (status) q.set("status", status);
  if (node) q.set("node", node);
  let tasks = [];
  let error = "";
  try { tasks = await api("GET", "/tasks?" + q); } catch (e) { error = e.message; }
  const names = Object.fromEntries(queues.map((x) => [x.id, x.name]));
  const rows = tasks.map((t) => `
    <tr><td><a class="task-link" href="#/task/${esc(t.id)}">${esc(t.id)}</a></td><td>${esc(names[t.queue.$oid] || t.queue.$oid)}</td>
      <td>${t.status} ${esc(t.status_name)}</td><td>${esc(t.node ?? "-")}</td><td>${plain(t.mtime)}</td>
      <td><code>${esc(JSON.stringify(t.params)).slice(0, 120)}</code></td></tr>`).join("");
  $("#view").innerHTML = `
    <form class="toolbar" id="task-search">
      <label>Queue <select id="search-queue"><option value="">any</option>${queues.map((x) =>
        `<option${x.name === queue || x.id === queue ? " selected" : ""}>${esc(x.name)}</option>`).join("")}</select></label>
      <label>Status <select id="search-status"><option value="">any</option>${Object.entries(STATUS).map(([c, n]) =>
        `<option value="${c}"${c === status ? " selected" : ""}>${c} ${n}</option>`).join("")}</select></label>
      <label>Node <input id="search-node" value="${esc(node)}" placeholder="any (null = unclaimed)"></label>
      <button type="submit">Search</button>
      <button type="button" id="prev"${skip === 0 ? " disabled" : ""}>Previous</button>
      <button type="button" id="next"${tasks.length < PAGE ? " disabled" : ""}>Next</button>
      <span>${tasks.length ? `${skip + 1}–${skip + tasks.length}` : ""}</span>
    </form>
    ${error ? `<p class="error">${esc(error)}</p>` : ""}
    <table id="tasks"><thead><tr><th>Task</th><th>Queue</th><th>Status</th><th>Node</th><th>Modified</th><th>Params</th></tr></thead>
    <tbody>${rows || '<tr><td colspan="6">No tasks.</td></tr>'}</tbody></table>`;
  const go = (newSkip) => {
    const p = new URLSearchParams();
    if ($("#search-queue").value) p.set("queue", $("#search-queue").value);
    if ($("#search-status").value) p.set("status", $("#search-status").value);
    if ($("#search-node").value) p.set("node", $("#search-node").value);
    if (newSkip) p.set("skip", newSkip);
    location.hash = "#/tasks?" + p;
  };
  $("#task-search").onsubmit = (e) => { e.preventDefault(); go(0); };
  $("#prev").onclick = () => go(Math.max(0, skip - PAGE));
  $("#next").onclick = () => go(skip + PAGE);
}

// The finished task on screen: auto-refresh leaves it alone (its output cannot change).
let shownFinished = null;
let taskPoll = null;

async function showTask(id, refresh) {
  clearTimeout(taskPoll);
  if (refresh && shownFinished === id) return;
  const t = await api("GET", "/tasks/" + encodeURIComponent(id));
  shownFinished = t.status > 0 ? id : null;
  if (t.status <= 0) {
    // Queued, claimed or running: look again in a second while this page is shown.
    taskPoll = setTimeout(() => {
      if (location.hash === "#/task/" + id) showTask(id, true).catch((e) => say(e.message, "error"));
    }, 1000);
  }
  const raw = (k) => "/tasks/" + encodeURIComponent(t.id) + "/" + k;
  // Inline text is in the task; a GridFS file (an {$oid}) is streamed in after the page is drawn.
  const isFile = (k) => t[k] && typeof t[k] === "object";
  const file = (k) => t[k] === null || t[k] === undefined ? "" : isFile(k)
    ? ` <small>(GridFS file ${esc(t[k].$oid)}, <a href="${raw(k)}" target="_blank">raw</a>)</small>`
    : ` <small>(<a href="${raw(k)}" target="_blank">raw</a>)</small>`;
  const text = (k) => isFile(k) ? "" : esc(t[k] ?? "");
  // Cancel before it starts, kill while it runs (a kill already asked is shown, not
  // offered), retry once it has finished.
  const waiting = t.status === -2 || t.status === -7 || t.status === -4;
  const running = (t.status === -1 || t.status === 0) && !t.stop;
  const finished = t.status > 0 || [-6, -5, -3].includes(t.status);
  const actions = waiting ? `<button id="task-cancel">Cancel</button>`
    : running ? `<button id="task-kill">Kill</button>`
    : finished ? `<button id="task-retry">Retry</button>` : "";
  const attempts = (t.attempts ?? []).map((a, i) => `<tr><td>${i + 1}</td><td>${a.status} ${esc(a.status_name)}</td><td>${esc(a.node ?? "-")}</td><td>${a.started ? plain(a.started) : "-"}</td><td>${plain(a.ended)}</td><td>${esc(a.reason)}</td></tr>`).join("");
  const attemptList = attempts ? `<h3>Attempts</h3><table id="task-attempts"><thead><tr><th>#</th><th>Status</th><th>Node</th><th>Started</th><th>Ended</th><th>Reason</th></tr></thead><tbody>${attempts}</tbody></table>` : "";
  const stop = t.stop ? `<dt>${t.stop.action === "kill" ? "Killed" : "Cancelled"}</dt><dd id="task-stop">by ${esc(t.stop.by)} at ${plain(t.stop.at)}${t.stop.reason ? ": " + esc(t.stop.reason) : ""}</dd>` : "";
  const runAt = t.run_at ? `<dt>Run at</dt><dd id="task-run-at">${plain(t.run_at)}</dd>` : "";
  const p = t.progress;
  const pct = p && typeof p.percent === "number" ? Math.max(0, Math.min(100, p.percent)) : null;
  const progress = p ? `<dt>Progress</dt><dd id="task-progress">${pct === null ? "<progress></progress>" : `<progress max="100" value="${pct}"></progress> ${pct.toFixed(0)}%`} ${esc(p.info)}</dd>` : "";
  $("#view").innerHTML = `
    <h2>Task ${esc(t.id)}</h2>
    <div class="toolbar">${actions}</div>
    <dl id="task">
      <dt>Status</dt><dd id="task-status">${t.status} ${esc(t.status_name)}</dd>${progress}${runAt}${stop}
      <dt>Queue</dt><dd><a href="#/tasks?queue=${esc(t.queue.$oid)}">${esc(t.queue.$oid)}</a></dd>
      <dt>Node</dt><dd>${esc(t.node ?? "-")}</dd>
      <dt>Created</dt><dd>${plain(t.ctime)}</dd>
      <dt>Modified</dt><dd>${plain(t.mtime)}</dd>${t.batch ? `<dt>Batch</dt><dd id="task-batch"><a href="/batches/${encodeURIComponent(t.batch)}" target="_blank">${esc(t.batch)}</a></dd>` : ""}
    </dl>
    <div id="task-deps"></div>
    ${attemptList}
    <h3>Params</h3><pre id="task-params">${esc(JSON.stringify(t.params, null, 2))}</pre>
    <h3>stdout${file("stdout")}</h3><pre id="task-stdout">${text("stdout")}</pre>
    <h3>stderr${file("stderr")}</h3><pre id="task-stderr">${text("stderr")}</pre>`;
  const act = (verb, done) => async () => {
    const reason = prompt(`Why ${verb} this task? (optional)`) ?? null;
    if (reason === null) return;
    try {
      await api("POST", raw(verb), { reason });
      say(done);
    } catch (e) {
      say(e.message, "error");
    }
    shownFinished = null;
    await showTask(t.id, false);
  };
  if ($("#task-cancel")) $("#task-cancel").onclick = act("cancel", "task cancelled");
  if ($("#task-kill")) $("#task-kill").onclick = act("kill", "kill asked; its DEN stops the plugin");
  if ($("#task-retry")) $("#task-retry").onclick = act("retry", "task queued again");
  showDeps(t).catch((e) => { $("#task-deps").textContent = "cannot read the task's dependencies: " + e.message; });
  for (const k of ["stdout", "stderr"]) {
    const pre = $("#task-" + k);
    if (isFile(k)) streamInto(pre, raw(k)).catch((e) => { pre.append("\n[cannot read the output: " + e.message + "]"); });
    else pre.dataset.complete = "1";
  }
}

// Status colours of the dependency graph.
const STATUS_COLOUR = { 1: "var(--ok)", 2: "var(--bad)", "-5": "var(--warn)", "-6": "var(--bad)", "-4": "var(--muted)" };

// The task's place in its DAG: what it waits for (and which of those it still waits
// for), the tasks waiting for it, and a graph of both around it.
async function showDeps(t) {
  const box = $("#task-deps");
  const children = await api("GET", "/tasks?after=" + encodeURIComponent(t.id) + "&limit=200&fields=status");
  const after = t.after ?? [];
  if (!after.length && !children.length) return;
  const pending = new Set(t.pending ?? []);
  const parents = await Promise.all(after.map(async (k) => {
    if (k.startsWith("batch:")) return { key: k, label: "batch " + k.slice(6), href: "/batches/" + encodeURIComponent(k.slice(6)), status: null };
    const found = await api("GET", "/tasks?id=" + encodeURIComponent(k) + "&fields=status").catch(() => []);
    return { key: k, label: k, href: "#/task/" + k, status: found.length ? found[0].status : null };
  }));
  const kids = children.map((c) => ({ key: c.id, label: c.id, href: "#/task/" + c.id, status: c.status }));
  const item = (n) => `<li><a href="${n.href}">${esc(n.label)}</a> ${n.status === null ? "" : `<span class="state" style="background:${STATUS_COLOUR[n.status] ?? "var(--accent)"}">${n.status}</span>`}${pending.has(n.key) ? " <small>(waiting for it)</small>" : ""}</li>`;
  const failure = t.after_failure === "run" ? " <small>(runs even if one fails)</small>" : "";
  box.innerHTML = `
    ${parents.length ? `<h3>Waits for${failure}</h3><ul id="task-parents">${parents.map(item).join("")}</ul>` : ""}
    ${kids.length ? `<h3>Waited for by</h3><ul id="task-children">${kids.map(item).join("")}</ul>` : ""}
    <h3>Graph</h3>${depGraph(parents, { key: t.id, label: t.id, status: t.status }, kids)}`;
}

// An SVG of parents → task → children, each node a link coloured by its status.
function depGraph(parents, self, kids) {
  const W = 220, H = 26, GAP = 10, COL = 300;
  const rows = Math.max(parents.length, kids.length, 1);
  const height = rows * (H + GAP) + GAP;
  const y = (i, n) => GAP + (height - GAP - n * (H + GAP)) / 2 + i * (H + GAP);
  const node = (n, x, yy, cls) => `<a href="${n.href ?? "#/task/" + n.key}"><g class="node ${cls}" data-status="${n.status ?? ""}"><rect x="${x}" y="${yy}" width="${W}" height="${H}" rx="5" fill="${STATUS_COLOUR[n.status] ?? "var(--accent)"}"></rect><text x="${x + 8}" y="${yy + 17}" fill="#fff">${esc(n.label.length > 30 ? n.label.slice(0, 29) + "…" : n.label)}</text></g></a>`;
  const sy = y(0, 1);
  const edge = (x1, y1, x2, y2) => `<line x1="${x1}" y1="${y1 + H / 2}" x2="${x2}" y2="${y2 + H / 2}" stroke="var(--muted)"></line>`;
  let out = "";
  parents.forEach((p, i) => { out += edge(W, y(i, parents.length), COL, sy) + node(p, 0, y(i, parents.length), "parent"); });
  kids.forEach((c, i) => { out += edge(COL + W, sy, 2 * COL, y(i, kids.length)) + node(c, 2 * COL, y(i, kids.length), "child"); });
  out += node(self, COL, sy, "self");
  return `<svg id="task-graph" role="img" aria-label="dependencies of this task" width="${2 * COL + W}" height="${height}" viewBox="0 0 ${2 * COL + W} ${height}">${out}</svg>`;
}

// Shows at most this much of a streamed output; the raw link has all of it.
const SHOW_MAX = 4 * 1024 * 1024;

// Appends the text of `url` to `pre` as it arrives, as text nodes (never parsed as HTML).
async function streamInto(pre, url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(resp.status + " " + resp.statusText);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let shown = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const piece = decoder.decode(value, { stream: true });
    if (shown + piece.length > SHOW_MAX) {
      pre.append(piece.slice(0, SHOW_MAX - shown));
      pre.insertAdjacentHTML("afterend", `<p class="more">Only the first ${SHOW_MAX / 1048576} MiB are shown: <a href="${esc(url)}" target="_blank">the whole output</a>.</p>`);
      reader.cancel();
      pre.dataset.complete = "1";
      return;
    }
    pre.append(piece);
    shown += piece.length;
  }
  pre.append(decoder.decode());
  pre.dataset.complete = "1";
}

// ---- balance ------------------------------------------------------------------------------

async function showBalance() {
  const [b, queues] = await Promise.all([api("GET", "/balance"), api("GET", "/queues")]);
  const byName = Object.fromEntries(queues.map((q) => [q.name, q]));
  const lanes = (b.queues || []).map((lane, i) => `
    <tr data-lane="${i}"><td>${i === 0 ? "default" : "priority " + i}</td><td>${lane.map((name) => {
      const q = byName[name] || {};
      return `<span class="lane-queue" data-queue="${esc(name)}">${esc(name)}: share <b class="share">${esc(q.maxthreads ?? "-")}</b>
        of ${esc(q.threads ?? "paused")}, ${q.running ?? 0} running, ${q.queued ?? 0} queued</span>`;
    }).join("<br>")}</td></tr>`).join("");
  const settings = { max_tasks: b.max_tasks || {}, queues: b.queues || [] };
  if (b.disabled) settings.disabled = b.disabled;
  $("#view").innerHTML = `
    <p id="balance-status">${b.notice ? esc(b.notice) : `QueueBalance <span class="badge ${esc(b.status)}">${esc(b.status ?? "not run")}</span>
      ${esc(b.message ?? "")}${b.max_tasks_now != null ? ` — limit now <b id="balance-limit">${b.max_tasks_now}</b>` : ""}`}
      ${b.settings && !b.settings.enabled ? " (not enabled in this server's config)" : ""}</p>
    <table id="balance-lanes"><thead><tr><th>Lane</th><th>Queues</th></tr></thead>
      <tbody>${lanes || '<tr><td colspan="2">No queues are balanced.</td></tr>'}</tbody></table>
    <h2>Settings</h2>
    <p><small>max_tasks: "&lt;day&gt; &lt;HH:MM&gt;" (day 0-6, 0 = Sunday, or *) → most running tasks from then on;
      queues: lanes of queue names, the first the default lane; disabled: epoch seconds or null.
      Known queues: ${esc((b.known_queues || []).join(", "))}.</small></p>
    <textarea id="balance-edit" rows="10" cols="60" spellcheck="false">${esc(JSON.stringify(settings, null, 2))}</textarea>
    <div class="toolbar"><button id="balance-save">Save</button></div>`;
  $("#balance-save").onclick = async () => {
    let body;
    try {
      body = JSON.parse($("#balance-edit").value);
    } catch (err) {
      say("the balance is not valid JSON: " + err.message, "error");
      return;
    }
    await write(() => api("POST", "/balance", body), "QueueBalance saved");
  };
}

// ---- shell --------------------------------------------------------------------------------

async function render(refresh = false) {
  const hash = location.hash || "#/queues";
  const [path, query] = hash.slice(1).split("?");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", hash.startsWith(a.getAttribute("href"))));
  try {
    if (path.startsWith("/task/")) await showTask(decodeURIComponent(path.slice(6)), refresh);
    else if (path === "/nodes") await showNodes();
    else if (path === "/tasks") await showTasks(new URLSearchParams(query || ""));
    else if (path === "/plugins") await showPlugins();
    else if (path === "/balance") await showBalance();
    else await showQueues();
  } catch (e) {
    say(e.message, "error");
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
