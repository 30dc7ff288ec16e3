"use strict";
// Disbatch web UI: the task list and each task's page (output, actions, dependencies).

// ---- tasks --------------------------------------------------------------------------------

async function showTasks(pass, params) {
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
      <td>${t.status} ${esc(t.status_name)}</td><td>${esc(t.node ?? "-")}</td><td>${when(t.mtime)}</td>
      <td><code>${esc(JSON.stringify(t.params)).slice(0, 120)}</code></td></tr>`).join("");
  view(pass).innerHTML = `
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

// Seconds between two times ({"$date"} or strings).
const span = (a, b) => (new Date(b.$date ?? b) - new Date(a.$date ?? a)) / 1000;

// Queue names by id, read once (and again for an id not seen yet).
let queueNames = {};
async function queueNameOf(id) {
  if (!(id in queueNames)) {
    const queues = await api("GET", "/queues").catch(() => []);
    queueNames = Object.fromEntries(queues.map((q) => [q.id, q.name]));
  }
  return queueNames[id] ?? id;
}

// The finished task on screen: auto-refresh leaves it alone (its output cannot change).
let shownFinished = null;
let taskPoll = null;

async function showTask(pass, id) {
  clearTimeout(taskPoll);
  if (pass.refresh && shownFinished === id) return;
  const t = await api("GET", "/tasks/" + encodeURIComponent(id));
  const queueName = await queueNameOf(t.queue.$oid);
  const box = view(pass);
  shownFinished = t.status > 0 ? id : null;
  clearTimeout(taskPoll);
  if (t.status <= 0) {
    // Queued, claimed or running: look again in a second while this page is shown.
    taskPoll = setTimeout(() => {
      if (location.hash === "#/task/" + id) showTask(begin(true), id).catch((e) => { if (!(e instanceof Stale)) say(e.message, "error"); });
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
  const attempts = (t.attempts ?? []).map((a, i) => `<tr><td>${i + 1 + (t.attempts_dropped ?? 0)}</td><td>${a.status} ${esc(a.status_name)}</td><td>${esc(a.node ?? "-")}</td><td>${a.started ? when(a.started) : "-"}</td><td>${when(a.ended)}</td><td class="num">${a.started ? fmtSecs(span(a.started, a.ended)) : "-"}</td><td>${esc(a.reason)}</td></tr>`).join("");
  const dropped = t.attempts_dropped > 0 ? `<p id="task-attempts-dropped">The last ${fmtNum(t.attempts.length)} kept; ${fmtNum(t.attempts_dropped)} older not kept.</p>` : "";
  const attemptList = attempts ? `<h3>Attempts (${fmtNum(t.attempts.length)})</h3>${dropped}<div class="scroll"><table id="task-attempts"><thead><tr><th>#</th><th>Status</th><th>Node</th><th>Started</th><th>Ended</th><th>Duration</th><th>Reason</th></tr></thead><tbody>${attempts}</tbody></table></div>` : "";
  const duration = finished ? `<dt>Duration</dt><dd id="task-duration">${fmtSecs(span(t.ctime, t.mtime))} <small>from submitted to ended</small></dd>`
    : t.status === 0 ? `<dt>Running since</dt><dd id="task-duration">${when(t.mtime)}</dd>` : "";
  const stop = t.stop ? `<dt>${t.stop.action === "kill" ? "Killed" : "Cancelled"}</dt><dd id="task-stop">by ${esc(t.stop.by)} ${when(t.stop.at)}${t.stop.reason ? ": " + esc(t.stop.reason) : ""}</dd>` : "";
  const runAt = t.run_at ? `<dt>Run at</dt><dd id="task-run-at">${when(t.run_at)}</dd>` : "";
  const startedAt = t.started ? `<dt>Started</dt><dd id="task-started">${when(t.started)}</dd>` : "";
  const p = t.progress;
  const pct = p && typeof p.percent === "number" ? Math.max(0, Math.min(100, p.percent)) : null;
  const progress = p ? `<dt>Progress</dt><dd id="task-progress">${pct === null ? "<progress></progress>" : `<progress max="100" value="${pct}"></progress> ${pct.toFixed(0)}%`} ${esc(p.info)}</dd>` : "";
  box.innerHTML = `
    <h2>Task ${esc(t.id)}</h2>
    <div class="toolbar">${actions}</div>
    <dl id="task">
      <dt>Status</dt><dd id="task-status">${t.status} ${esc(t.status_name)}</dd>${progress}${duration}${runAt}${startedAt}${stop}
      <dt>Queue</dt><dd id="task-queue"><a href="#/queue/${encodeURIComponent(queueName)}">${esc(queueName)}</a> <small>(<a href="#/tasks?queue=${esc(t.queue.$oid)}">its tasks</a>)</small></dd>
      <dt>Node</dt><dd>${esc(t.node ?? "-")}</dd>
      <dt>Created</dt><dd>${when(t.ctime)}</dd>
      <dt>Modified</dt><dd>${when(t.mtime)}</dd>${t.batch ? `<dt>Batch</dt><dd id="task-batch"><a href="/batches/${encodeURIComponent(t.batch)}" target="_blank">${esc(t.batch)}</a></dd>` : ""}
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
    await showTask(begin(false), t.id).catch((e) => { if (!(e instanceof Stale)) throw e; });
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

