// Drives the operator's pages in headless Chromium against a real DEN that ran real tasks:
// the overview (the landing page), a queue's page and a task's page. Checks that each plot
// shows the API's numbers — as many points as GET /stats has, with the same values — that
// the queue's settings are edited with the API's validation messages, and that the pages
// work from the keyboard, on a narrow window and in the dark theme. Screenshots go to OUT_DIR.
// Usage: node dashboard.mjs <base-url> <queue> <succeeded> <failed> <finished-task-id> <out-dir>
import { join } from "node:path";
import { launch } from "./launch.mjs";

const [base, queue, succeeded, failed, taskId, outDir] = process.argv.slice(2);
const { page, errors, close } = await launch({ width: 1280, height: 900 });
let step = 0;
const shot = (name) => page.screenshot({ path: join(outDir, `${String(++step).padStart(2, "0")}-${name}.png`), fullPage: true });
const api = async (path) => (await fetch(base + path)).json();
const fail = (what, seen) => { throw new Error(what + ": " + JSON.stringify(seen)); };
const deadline = (secs) => Date.now() + secs * 1000;

// The values a chart's series holds, as drawn: its points (circles) and data-values.
const drawn = (chart, series) => page.evaluate(([chart, series]) => {
  const g = document.querySelector(`#${chart} g.series[data-series="${series}"]`);
  if (!g) return null;
  return {
    values: g.dataset.values.split(",").map((v) => (v === "" ? null : Number(v))),
    points: [...g.querySelectorAll("circle.pt")].map((c) => Number(c.dataset.v)),
  };
}, [chart, series]);

// Compares a drawn series with the API's; the page and the API are read at nearly the same
// moment, so a minute turning over in between is retried (the caller reloads).
function same(seen, want) {
  if (!seen) return false;
  const points = want.filter((v) => v != null);
  return seen.values.length === want.length && seen.values.every((v, i) => v === want[i]) &&
    seen.points.length === points.length && seen.points.every((v, i) => v === points[i]);
}

async function plotsMatch(hash, ready, uri, pick) {
  for (let tries = 0; ; tries++) {
    await page.goto(base + "/" + hash);
    await page.waitForSelector(ready);
    const stats = await api(uri);
    const checks = pick(stats);
    let ok = true;
    for (const [chart, series, want] of checks) {
      const seen = await drawn(chart, series);
      if (!same(seen, want)) {
        ok = false;
        if (tries >= 4) fail(`${chart} ${series} drawn differs from GET ${uri}`, { seen, want });
      }
    }
    if (ok) return stats;
  }
}

try {
  // The counters reach the store within a few seconds of the runs: wait for all of them.
  for (const end = deadline(60); ; ) {
    const s = await api("/stats?since=1h");
    if (s.series[0].summary.succeeded === Number(succeeded) && s.series[0].summary.failed === Number(failed)) break;
    if (Date.now() > end) fail("GET /stats never counted the runs", s.series[0].summary);
    await new Promise((r) => setTimeout(r, 250));
  }
  // The leader's depth sample of the queue.
  for (const end = deadline(60); ; ) {
    const s = await api("/stats?since=1h&queue=" + queue);
    if (s.series[1].points.some((p) => p.depth != null)) break;
    if (Date.now() > end) fail("no depth sample", s.series[1].points.slice(-2));
    await new Promise((r) => setTimeout(r, 250));
  }

  // The overview is the landing page; its plots hold GET /stats's points.
  const stats = await plotsMatch("", "#chart-throughput", "/stats?since=1h&step=1m", (s) => {
    const total = s.series[0].points;
    const q = s.series.find((x) => x.name === queue);
    return [
      ["chart-throughput", "succeeded", total.map((p) => p.succeeded)],
      ["chart-throughput", "failed", total.map((p) => p.failed)],
      ["chart-depth", q.queue, q.points.map((p) => p.depth)],
    ];
  });
  const points = stats.series[0].points.length;
  if (points !== 61) fail("an hour in minutes is 61 points", points);
  const circles = await page.locator('#chart-throughput g.series[data-series="succeeded"] circle.pt').count();
  if (circles !== points) fail("succeeded points drawn", circles);
  const card = (await page.textContent("#card-succeeded .value")).trim();
  if (card !== Number(succeeded).toLocaleString()) fail("succeeded card", card);
  const row = page.locator(`#overview-queues tr[data-queue="${queue}"]`);
  if ((await row.locator("td.succeeded").textContent()).trim() !== Number(succeeded).toLocaleString()) fail("queue row", await row.textContent());
  const q = stats.series.find((x) => x.name === queue).summary;
  const shownP95 = (await row.locator("td.p95").textContent()).trim();
  if (q.p95 == null || shownP95 === "-") fail("p95", { q, shownP95 });
  const node = page.locator("#overview-nodes tr").nth(1);
  if (!(await node.textContent()).includes("leader")) fail("the leader is not shown", await node.textContent());
  if (!(await node.locator(".usage").textContent()).includes("/ 3")) fail("running / maxthreads", await node.locator(".usage").textContent());
  // The data behind a chart is a table too.
  await page.click("#chart-throughput details summary");
  const rows = await page.locator("#chart-throughput table.chart-data tbody tr").count();
  if (rows !== points) fail("data table rows", rows);
  await shot("overview");

  // Keyboard: the navigation and the range are reachable and work without a mouse.
  await page.focus("#nav-queues");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#queues");
  await page.focus("#nav-overview");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#overview-range");
  await page.focus("#overview-range");
  await page.selectOption("#overview-range", "1");
  await page.waitForFunction(() => document.querySelector("#chart-throughput figcaption")?.textContent.includes("per 5 min"));
  const sixHours = await page.locator('#chart-throughput g.series[data-series="succeeded"] circle.pt').count();
  if (sixHours !== 73) fail("6 h in 5 min steps", sixHours);
  await page.selectOption("#overview-range", "0");
  await page.waitForFunction(() => document.querySelector("#chart-throughput figcaption")?.textContent.includes("per 1 min"));

  // The queue's page: its plots, failures with their reasons, settings with validation.
  await page.click(`#overview-queues a[href="#/queue/${queue}"]`);
  await page.waitForSelector("#queue-throughput");
  await plotsMatch("#/queue/" + queue, "#queue-throughput", "/stats?since=1h&step=1m&queue=" + queue, (s) => {
    const p = s.series[1].points;
    return [
      ["queue-throughput", "succeeded", p.map((x) => x.succeeded)],
      ["queue-throughput", "failed", p.map((x) => x.failed)],
      ["queue-failure-rate", "rate", p.map((x) => (x.succeeded + x.failed ? x.failed / (x.succeeded + x.failed) : null))],
      ["queue-durations-chart", "p95", p.map((x) => x.p95)],
    ];
  });
  const failures = await page.locator("#queue-failures tbody tr").count();
  if (failures !== Number(failed)) fail("failures listed", failures);
  if (!(await page.textContent("#queue-failures")).includes("bad input")) fail("failure reason", await page.textContent("#queue-failures"));
  await shot("queue");
  // The API's validation message is shown beside the form (the browser checks threads ≥ 0 itself).
  await page.fill("#queue-activity-timeout", "soon");
  await page.click("#queue-save");
  await page.waitForFunction(() => document.querySelector("#queue-error").textContent.includes("activity_timeout"));
  await shot("queue-validation");
  await page.fill("#queue-activity-timeout", "");
  await page.fill("#queue-retry", "{not json");
  await page.click("#queue-save");
  await page.waitForFunction(() => document.querySelector("#queue-error").textContent.includes("not valid JSON"));
  await page.fill("#queue-retry", "");
  await page.selectOption("#queue-on-orphan", "requeue");
  await page.click("#queue-save");
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes("saved"));
  const saved = await api("/queues/" + queue);
  if (saved.on_orphan !== "requeue" || saved.threads !== 3) fail("settings not saved", saved);

  // A finished task's page: its queue by name, its duration, times relative and absolute.
  await page.goto(base + "/#/task/" + taskId);
  await page.waitForSelector("#task-duration");
  if ((await page.textContent("#task-queue")).trim().split(" ")[0] !== queue) fail("queue shown", await page.textContent("#task-queue"));
  if (!(await page.locator("#task time").first().getAttribute("datetime"))) fail("times carry their absolute value", "");
  await shot("task");

  // A narrow window, and the dark theme the system asks for.
  await page.setViewportSize({ width: 380, height: 800 });
  await page.goto(base + "/");
  await page.waitForSelector("#chart-throughput");
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 2) fail("the overview is wider than a narrow window", overflow);
  await shot("overview-narrow");
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.emulateMedia({ colorScheme: "dark" });
  await page.goto(base + "/#/queue/" + queue);
  await page.waitForSelector("#queue-throughput");
  const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  if (bg === "rgb(247, 248, 250)") fail("the dark theme is not applied", bg);
  await shot("queue-dark");
  if (errors.length) throw new Error("page errors: " + errors.join("; "));
  console.log(JSON.stringify({ ok: true, screenshots: step, points }));
} catch (e) {
  await shot("failure").catch(() => {});
  console.error(String(e && e.stack || e));
  process.exitCode = 1;
} finally {
  await close();
}
