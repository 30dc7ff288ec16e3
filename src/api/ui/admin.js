"use strict";
// Disbatch web UI: nodes, plugins and the QueueBalance.

// ---- nodes --------------------------------------------------------------------------------

async function showNodes(pass) {
  const nodes = await api("GET", "/nodes");
  const rows = nodes.map((n) => `
    <tr data-node="${esc(n.node)}">
      <td>${esc(n.node)}<br><small>${esc(n.id)}</small></td>
      <td><input class="edit-maxthreads" type="number" min="0" data-node="${esc(n.node)}" value="${n.maxthreads ?? ""}" placeholder="no limit"></td>
      <td>${plain(n.timestamp)} (${Math.round(n.age_secs)} s ago)</td>
      <td><span class="state ${n.fresh ? "fresh" : "stale"}">${n.fresh ? "fresh" : "stale"}</span>${n.leader ? ' <span class="state leader" title="holds the leader lease: the orphan sweep runs here">leader</span>' : ""}</td>
      <td><a href="#/tasks?node=${encodeURIComponent(n.node)}">tasks</a></td>
    </tr>`).join("");
  view(pass).innerHTML = `<table id="nodes"><thead><tr><th>Node</th><th>Maxthreads</th><th>Heartbeat</th><th>State</th><th></th></tr></thead>
    <tbody>${rows || '<tr><td colspan="5">No nodes have reported yet.</td></tr>'}</tbody></table>`;
  document.querySelectorAll(".edit-maxthreads").forEach((el) => el.addEventListener("change", async () => {
    const maxthreads = el.value === "" ? null : Number(el.value);
    await write(() => api("POST", "/nodes/" + encodeURIComponent(el.dataset.node), { maxthreads }), "maxthreads set to " + (maxthreads ?? "null"));
  }));
}

// ---- plugins ------------------------------------------------------------------------------

async function showPlugins(pass) {
  const list = await api("GET", "/plugins?full=1");
  const rows = list.map((p) => `
    <tr data-plugin="${esc(p.name)}">
      <td>${esc(p.name)}</td><td>${esc(p.source)}</td><td>${p.allowed ? "yes" : "no"}</td><td>${p.versions}</td>
      <td><code title="${esc(p.sha256)}">${esc((p.sha256 || "-").slice(0, 12))}</code></td><td>${esc(p.size ?? "-")}</td>
      <td>${esc(p.wit ?? "-")}</td><td>${plain(p.uploaded)}</td><td>${esc(p.uploaded_by ?? "-")}</td>
      <td>${p.versions ? `<button class="delete-plugin" data-name="${esc(p.name)}">Delete</button>` : ""}</td>
    </tr>`).join("");
  view(pass).innerHTML = `
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

// ---- balance ------------------------------------------------------------------------------

async function showBalance(pass) {
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
  view(pass).innerHTML = `
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

