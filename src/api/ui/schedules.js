"use strict";
// Disbatch web UI: the schedules (periodic tasks), their next occurrences and last task.

function scheduleTiming(s) {
  if (s.cron != null) return `cron <code>${esc(s.cron)}</code> <small>${esc(s.timezone)}</small>`;
  return `every <code>${esc(s.every)}</code>`;
}

async function showSchedules(pass) {
  const schedules = await api("GET", "/schedules");
  const rows = schedules.map((s) => `
    <tr data-schedule="${esc(s.name)}">
      <td>${esc(s.name)}</td>
      <td><a href="#/queue/${encodeURIComponent(s.queue_name ?? s.queue)}">${esc(s.queue_name ?? s.queue)}</a></td>
      <td>${scheduleTiming(s)}<br><small>catch up ${esc(s.catch_up)}${s.catch_up === "all" ? " (" + esc(s.catch_up_limit) + ")" : ""}, overlap ${esc(s.overlap)}</small></td>
      <td class="schedule-state">${s.paused ? "paused" : "active"}</td>
      <td class="next">${s.next.length ? s.next.map((t) => esc(new Date(t).toLocaleString())).join("<br>") : "-"}</td>
      <td class="last-task">${s.last_task ? `<a href="#/task/${encodeURIComponent(s.last_task.id)}">${esc(s.last_task.id)}</a><br><small>${esc(s.last_task.status_name)}</small>` : "-"}</td>
      <td><button class="toggle-schedule" data-name="${esc(s.name)}" data-paused="${s.paused}">${s.paused ? "resume" : "pause"}</button>
          <button class="delete-schedule" data-name="${esc(s.name)}">delete</button></td>
    </tr>`).join("");
  view(pass).innerHTML = `
    <table id="schedules"><thead><tr><th>Schedule</th><th>Queue</th><th>When</th><th>State</th>
      <th>Next occurrences</th><th>Last task</th><th></th></tr></thead><tbody>${rows ||
      '<tr><td colspan="7">No schedules yet (<code>disbatch set-schedule</code> or <code>POST /schedules</code>).</td></tr>'}</tbody></table>`;
  document.querySelectorAll(".toggle-schedule").forEach((el) => el.addEventListener("click", async () => {
    const paused = el.dataset.paused !== "true";
    await write(() => api("POST", "/schedules/" + encodeURIComponent(el.dataset.name), { paused }),
      (paused ? "paused " : "resumed ") + el.dataset.name);
  }));
  document.querySelectorAll(".delete-schedule").forEach((el) => el.addEventListener("click", async () => {
    if (!confirm("Delete schedule " + el.dataset.name + "? Its tasks stay.")) return;
    await write(() => api("DELETE", "/schedules/" + encodeURIComponent(el.dataset.name)), "deleted " + el.dataset.name);
  }));
}
