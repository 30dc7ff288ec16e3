"use strict";
// Disbatch web UI: the overview, the landing page — throughput, failures, queue depth,
// run-duration percentiles per queue, and each node's running tasks against its
// maxthreads. Everything comes from GET /stats (per-minute counters) and GET /queues
// (live counts), both cheap whatever the number of tasks, polled by the auto-refresh.

// The ranges offered: [label, since, step].
const RANGES = [["last hour", "1h", "1m"], ["last 6 hours", "6h", "5m"], ["last 24 hours", "24h", "15m"], ["last 7 days", "7d", "1h"]];
const COLOURS = ["#2457c5", "#1b7f3b", "#a86200", "#7c3aed", "#0e7490", "#be185d", "#4d7c0f", "#b42318"];

function rangeSelect(id, chosen) {
  return `<label>Range <select id="${id}">${RANGES.map(([label], i) => `<option value="${i}"${i === chosen ? " selected" : ""}>${label}</option>`).join("")}</select></label>`;
}

function chosenRange() {
  const i = Number(sessionStorage.getItem("disbatch-range") || 0);
  return RANGES[i] ? i : 0;
}

async function readStats(range, queue) {
  const [, since, step] = RANGES[range];
  const q = new URLSearchParams({ since, step });
  if (queue) q.set("queue", queue);
  return api("GET", "/stats?" + q);
}

function card(id, label, value, note = "") {
  return `<div class="card" id="${id}"><div class="label">${esc(label)}</div><div class="value">${value}</div>${note ? `<div class="note">${note}</div>` : ""}</div>`;
}

function percentiles(s) {
  return `${fmtSecs(s.p50)} / ${fmtSecs(s.p95)} / ${fmtSecs(s.p99)}`;
}

async function showOverview(pass) {
  const range = chosenRange();
  const [stats, queues] = await Promise.all([readStats(range), api("GET", "/queues")]);
  const total = stats.series[0];
  const perQueue = stats.series.slice(1);
  const times = pointTimes(total);
  const t = total.summary;
  // Ready to run now (status -2), as the depth chart plots; `queued` also counts cancelled and orphaned.
  const waiting = (q) => (q.counts && q.counts["-2"]) || 0;
  const queued = queues.reduce((a, q) => a + waiting(q), 0);
  const running = queues.reduce((a, q) => a + (q.running || 0), 0);
  const leader = stats.nodes.find((n) => n.leader);
  const live = Object.fromEntries(queues.map((q) => [q.id, q]));
  const rows = perQueue.map((s) => {
    const q = live[s.queue] || {};
    const m = s.summary;
    const ran = m.succeeded + m.failed;
    return `<tr data-queue="${esc(s.name ?? s.queue)}">
      <td>${s.name ? `<a href="#/queue/${encodeURIComponent(s.name)}">${esc(s.name)}</a>` : `<small>deleted ${esc(s.queue)}</small>`}</td>
      <td>${sparkline(field(s, "succeeded"), "succeeded per step in " + (s.name ?? s.queue))}</td>
      <td class="num succeeded">${fmtNum(m.succeeded)}</td><td class="num failed">${fmtNum(m.failed)}</td>
      <td class="num">${fmtPct(ran ? m.failed / ran : null)}</td>
      <td class="num p50">${fmtSecs(m.p50)}</td><td class="num p95">${fmtSecs(m.p95)}</td><td class="num p99">${fmtSecs(m.p99)}</td>
      <td class="num">${fmtNum(q.counts ? waiting(q) : undefined)}</td><td class="num">${fmtNum(q.running)}</td></tr>`;
  }).join("");
  const nodes = stats.nodes.map((n) => `<tr data-node="${esc(n.node)}">
      <td>${esc(n.node)}</td>
      <td><span class="state ${n.fresh ? "fresh" : "stale"}">${n.fresh ? "fresh" : "stale"}</span>${n.leader ? ' <span class="state leader">leader</span>' : ""}</td>
      <td class="running">${usageBar(n.running, n.maxthreads)}</td>
      <td>${when(Date.now() - n.age_secs * 1000)}</td></tr>`).join("");
  const depth = perQueue.filter((s) => s.name).map((s, i) => ({ name: s.queue, label: s.name, colour: COLOURS[i % COLOURS.length], values: field(s, "depth") }));
  view(pass).innerHTML = `
    <div class="toolbar"><h2>Overview</h2>${rangeSelect("overview-range", range)}</div>
    <div class="cards">
      ${card("card-succeeded", "Succeeded", fmtNum(t.succeeded), RANGES[range][0])}
      ${card("card-failed", "Failed", fmtNum(t.failed), fmtPct(t.succeeded + t.failed ? t.failed / (t.succeeded + t.failed) : null) + " of runs" + (t.retried ? `, ${fmtNum(t.retried)} retried` : ""))}
      ${card("card-durations", "Run time p50 / p95 / p99", percentiles(t))}
      ${card("card-queued", "Queued now", fmtNum(queued))}
      ${card("card-running", "Running now", fmtNum(running))}
      ${card("card-nodes", "Nodes", fmtNum(stats.nodes.filter((n) => n.fresh).length) + " fresh / " + fmtNum(stats.nodes.length), leader ? "leader: " + esc(leader.node) : "no leader")}
    </div>
    <div class="charts">
      ${lineChart("chart-throughput", { title: `Tasks ended per ${stats.step / 60} min, all queues`, times, series: [
        { name: "succeeded", label: "succeeded", colour: "var(--ok)", values: field(total, "succeeded") },
        { name: "failed", label: "failed", colour: "var(--bad)", values: field(total, "failed") }] })}
      ${lineChart("chart-depth", { title: "Queued tasks", times, series: depth.length ? depth : [{ name: "total", label: "all queues", colour: "var(--accent)", values: field(total, "depth") }] })}
    </div>
    <h3>Queues</h3>
    <div class="scroll"><table id="overview-queues"><thead><tr><th>Queue</th><th>Succeeded per step</th><th>Succeeded</th><th>Failed</th><th>Failure rate</th>
      <th>p50</th><th>p95</th><th>p99</th><th>Queued</th><th>Running</th></tr></thead>
      <tbody>${rows || '<tr><td colspan="10">No queues yet.</td></tr>'}</tbody></table></div>
    <h3>Nodes</h3>
    <div class="scroll"><table id="overview-nodes"><thead><tr><th>Node</th><th>State</th><th>Running / maxthreads</th><th>Heartbeat</th></tr></thead>
      <tbody>${nodes || '<tr><td colspan="4">No nodes have reported yet.</td></tr>'}</tbody></table></div>
    <p><small>Counted by the DENs per minute (${esc(stats.since)} to ${esc(stats.until)}); runs of Disbatch 4 DENs are not counted. Percentiles are bucket upper bounds (within 33%).</small></p>`;
  $("#overview-range").onchange = (e) => {
    sessionStorage.setItem("disbatch-range", e.target.value);
    render();
  };
}
