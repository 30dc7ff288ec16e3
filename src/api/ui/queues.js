"use strict";
// Disbatch web UI: the queue list and each queue's page.

// ---- queues -------------------------------------------------------------------------------

async function showQueues(pass) {
  const queues = await api("GET", "/queues");
  const rows = queues.map((q) => `
    <tr data-queue="${esc(q.name)}">
      <td><a class="queue-link" href="#/queue/${encodeURIComponent(q.name)}">${esc(q.name)}</a><br><small>${esc(q.id)}</small>${q.problem ?
        `<div class="problem">cannot be read: ${esc(q.problem)}</div>` : ""}${(q.problems || []).map((p) =>
        `<div class="problem">cannot run on ${esc(p.node)}: ${esc(p.reason)}</div>`).join("")}</td>
      <td><select class="edit-plugin" data-id="${esc(q.id)}">${pluginOptions(q.plugin)}</select></td>
      <td><input class="edit-threads" type="number" min="0" data-id="${esc(q.id)}" value="${q.threads ?? ""}" placeholder="paused">${q.maxthreads != null ?
        `<br><small class="share" title="the QueueBalance's share of this queue now">balance share ${q.maxthreads}</small>` : ""}${q.rate ?
        `<br><small class="rate" title="at most max task starts in any window of per, across every DEN; used: starts in the window ending now">rate ${esc(q.rate.max)} per ${esc(q.rate.per)}, used ${esc(q.rate_used ?? 0)}</small>` : ""}</td>
      <td>${esc(q.sort)}</td>
      <td class="num queued">${fmtNum(q.queued)}</td><td class="num running">${fmtNum(q.running)}</td><td class="num completed">${fmtNum(q.completed)}</td>
      <td><a href="#/tasks?queue=${encodeURIComponent(q.name)}">tasks</a>
          <button class="new-task" data-name="${esc(q.name)}">new task</button>
          <button class="delete-queue" data-id="${esc(q.id)}" data-name="${esc(q.name)}">delete</button></td>
    </tr>`).join("");
  view(pass).innerHTML = `
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


// ---- one queue ----------------------------------------------------------------------------

// The settings the queue page edits: [field, label, kind].
const QUEUE_FIELDS = [["plugin", "Plugin", "plugin"], ["threads", "Threads", "number"], ["sort", "Sort", "sort"],
  ["on_orphan", "On orphan", "orphan"], ["activity_timeout", "Activity timeout", "text"], ["next_queue", "Next queue", "text"],
  ["sandbox", "Sandbox", "json"], ["retry", "Retry policy", "json"], ["rate", "Rate limit {max, per}", "json"]];

function fieldInput(q, [name, label, kind]) {
  const v = q[name];
  const id = "queue-" + name.replace("_", "-");
  const select = (opts) => `<select id="${id}" name="${name}">${opts.map((o) => `<option${o === v ? " selected" : ""}>${o}</option>`).join("")}</select>`;
  const input = kind === "plugin" ? `<select id="${id}" name="${name}">${pluginOptions(v)}</select>`
    : kind === "sort" ? select(["default", "fifo", "lifo"])
    : kind === "orphan" ? select(["orphan", "requeue"])
    : kind === "number" ? `<input id="${id}" name="${name}" type="number" min="0" value="${v ?? ""}" placeholder="paused">`
    : kind === "json" ? `<textarea id="${id}" name="${name}" rows="4" cols="40" spellcheck="false" placeholder="null">${esc(v == null ? "" : JSON.stringify(v, null, 2))}</textarea>`
    : `<input id="${id}" name="${name}" value="${esc(v ?? "")}" placeholder="none">`;
  return `<label>${label} ${input}</label>`;
}

// The form's values that differ from the queue's, as a POST /queues/{queue} body.
function changedFields(q, form) {
  const body = {};
  for (const [name, label, kind] of QUEUE_FIELDS) {
    const raw = form.elements[name].value.trim();
    let v;
    if (kind === "number") v = raw === "" ? null : Number(raw);
    else if (kind === "json") {
      try { v = raw === "" ? null : JSON.parse(raw); } catch (e) { throw new Error(label + " is not valid JSON: " + e.message); }
    } else v = raw === "" && (name === "activity_timeout" || name === "next_queue") ? null : raw;
    if (JSON.stringify(v) !== JSON.stringify(q[name] ?? null)) body[name] = v;
  }
  return body;
}

async function showQueue(pass, name) {
  if (pass.refresh && $("#queue-settings") && $("#queue-settings").dataset.dirty) return;
  const range = chosenRange();
  const [q, stats, failures] = await Promise.all([
    api("GET", "/queues/" + encodeURIComponent(name)),
    // A queue the DCI cannot read is not a queue GET /stats knows: show it with no runs.
    readStats(range, name).catch(() => readStats(range)),
    api("GET", "/tasks?" + new URLSearchParams({ queue: name, status: "2", limit: "10" })),
  ]);
  const none = { succeeded: 0, failed: 0, retried: 0, mean: null, p50: null, p95: null, p99: null };
  const s = stats.series.find((x) => x.queue === q.id) || { summary: none, points: stats.series[0].points.map((p) => ({ ...none, t: p.t, depth: null })) };
  const times = pointTimes(s);
  const m = s.summary;
  const problems = [q.problem ? `cannot be read: ${q.problem}` : null, ...(q.problems || []).map((p) => `cannot run on ${p.node}: ${p.reason}`)].filter(Boolean);
  const reason = (t) => {
    const text = typeof t.stderr === "string" ? t.stderr.trim() : "";
    return text ? text.split("\n").slice(-1)[0].slice(0, 200) : t.stderr && t.stderr.$oid ? "(output in a file)" : "-";
  };
  const failed = failures.map((t) => `<tr><td><a href="#/task/${esc(t.id)}">${esc(t.id)}</a></td><td>${when(t.mtime)}</td><td>${esc(t.node ?? "-")}</td><td class="reason">${esc(reason(t))}</td></tr>`).join("");
  view(pass).innerHTML = `
    <div class="toolbar"><h2>Queue ${esc(q.name)}</h2><a href="#/tasks?queue=${encodeURIComponent(q.name)}">tasks</a>
      <button class="new-task" data-name="${esc(q.name)}">new task</button>${rangeSelect("queue-range", range)}</div>
    ${problems.length ? `<ul id="queue-problems">${problems.map((p) => `<li class="problem">${esc(p)}</li>`).join("")}</ul>` : '<p id="queue-problems">No problems reported.</p>'}
    <div class="cards">
      ${card("queue-queued", "Queued now", fmtNum((q.counts && q.counts["-2"]) || 0))}${card("queue-running", "Running now", fmtNum(q.running))}
      ${card("queue-succeeded", "Succeeded", fmtNum(m.succeeded), RANGES[range][0])}${card("queue-failed", "Failed", fmtNum(m.failed), fmtPct(m.succeeded + m.failed ? m.failed / (m.succeeded + m.failed) : null) + " of runs")}
      ${card("queue-durations", "Run time p50 / p95 / p99", percentiles(m))}
    </div>
    <div class="charts">
      ${lineChart("queue-throughput", { title: `Tasks ended per ${stats.step / 60} min`, times, series: [
        { name: "succeeded", label: "succeeded", colour: "var(--ok)", values: field(s, "succeeded") },
        { name: "failed", label: "failed", colour: "var(--bad)", values: field(s, "failed") }] })}
      ${lineChart("queue-failure-rate", { title: "Failure rate", times, format: fmtPct, series: [
        { name: "rate", label: "failed / ended", colour: "var(--bad)", values: failureRate(s) }] })}
      ${lineChart("queue-durations-chart", { title: "Run time", times, format: fmtSecs, series: [
        { name: "p50", label: "p50", colour: "var(--ok)", values: field(s, "p50") },
        { name: "p95", label: "p95", colour: "var(--warn)", values: field(s, "p95") },
        { name: "p99", label: "p99", colour: "var(--bad)", values: field(s, "p99") }] })}
    </div>
    <h3>Settings</h3>
    <form id="queue-settings" class="settings">${QUEUE_FIELDS.map((f) => fieldInput(q, f)).join("")}
      <div><button type="submit" id="queue-save">Save</button> <span id="queue-error" class="error" role="alert"></span></div></form>
    <h3>Last failures</h3>
    <div class="scroll"><table id="queue-failures"><thead><tr><th>Task</th><th>Failed</th><th>Node</th><th>Reason (last line of stderr)</th></tr></thead>
      <tbody>${failed || '<tr><td colspan="4">No failed tasks.</td></tr>'}</tbody></table></div>`;
  $("#queue-range").onchange = (e) => { sessionStorage.setItem("disbatch-range", e.target.value); render(); };
  $(".new-task").onclick = () => openNewTask(q.name);
  const form = $("#queue-settings");
  form.addEventListener("input", () => { form.dataset.dirty = "1"; });
  form.onsubmit = async (e) => {
    e.preventDefault();
    $("#queue-error").textContent = "";
    try {
      const body = changedFields(q, form);
      if (!Object.keys(body).length) { say("nothing changed"); return; }
      const changed = await api("POST", "/queues/" + q.id, body);
      say("saved " + Object.keys(body).join(", "));
      if (changed.name !== name) location.hash = "#/queue/" + encodeURIComponent(changed.name);
      else await showQueue(begin(false), changed.name);
    } catch (err) {
      if (!(err instanceof Stale)) $("#queue-error").textContent = err.message;
    }
  };
}
