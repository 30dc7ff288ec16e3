// Drives the Disbatch web UI in headless Chromium: creates a queue, edits its threads,
// submits a task and follows it until the DEN has run it, edits a node's maxthreads and
// opens a finished task's GridFS-backed output, cancels a scheduled task, kills a
// running one and retries it, uploads a plugin component, shows a DAG around a task, pauses and resumes a schedule. Screenshots go to OUT_DIR.
// Usage: node ui.mjs <base-url> <finished-task-id> <expected-stdout-snippet> <out-dir> <component.wasm>
import { join } from "node:path";
import { launch } from "./launch.mjs";

const [base, taskId, expected, outDir, component] = process.argv.slice(2);
const { page, errors, close } = await launch({ width: 1280, height: 800 });
let step = 0;
let submitted = null;
const shot = (name) => page.screenshot({ path: join(outDir, `${String(++step).padStart(2, "0")}-${name}.png`), fullPage: true });
const api = async (path) => (await fetch(base + path)).json();
const post = async (path, body) => (await fetch(base + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })).json();
page.on("dialog", (d) => d.accept(d.type() === "prompt" ? "from the browser" : undefined));

try {
  await page.goto(base + "/#/queues");
  await page.waitForSelector("#queues");
  await shot("queues");

  await page.click("#new-queue");
  await page.fill("#new-queue-name", "browser-q");
  await page.selectOption("#new-queue-plugin", "demo");
  await page.fill("#new-queue-threads", "1");
  await shot("new-queue-dialog");
  await page.click("#new-queue-create");
  await page.waitForSelector('tr[data-queue="browser-q"]');
  const created = await api("/queues/browser-q");
  if (created.plugin !== "demo" || created.threads !== 1) throw new Error("queue not created as asked: " + JSON.stringify(created));

  const threads = page.locator('tr[data-queue="browser-q"] .edit-threads');
  await threads.fill("7");
  await threads.press("Enter");
  await threads.blur();
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes("threads set to 7"));
  const edited = await api("/queues/browser-q");
  if (edited.threads !== 7) throw new Error("threads not saved: " + JSON.stringify(edited));
  await page.waitForSelector('tr[data-queue="browser-q"] .edit-threads[value="7"]');
  await shot("threads-edited");

  // Submit a task through the UI; the DEN runs it and the task page follows it to the end.
  await page.click('tr[data-queue="browser-q"] .new-task');
  await page.fill("#new-task-params", JSON.stringify({ message: "typed in the browser", repeat: 3 }));
  await shot("new-task-dialog");
  await page.click("#new-task-create");
  await page.waitForFunction(() => location.hash.startsWith("#/task/"));
  submitted = decodeURIComponent((await page.evaluate(() => location.hash)).slice("#/task/".length));
  await page.waitForFunction(() => (document.querySelector("#task-status")?.textContent || "").includes("succeeded"), null, { timeout: 120000 });
  const ran = await page.textContent("#task-stdout");
  if (ran !== "typed in the browser\n".repeat(3)) throw new Error("submitted task's stdout: " + JSON.stringify(ran));
  await shot("submitted-task-finished");
  await page.click("#nav-queues");
  await page.waitForSelector('tr[data-queue="browser-q"] td.completed');
  const completed = await page.textContent('tr[data-queue="browser-q"] td.completed');
  if (completed.trim() !== "1") throw new Error("queue grid shows completed " + completed);

  await page.click("#nav-nodes");
  await page.waitForSelector("#nodes");
  // The only DEN leads the cluster, and the page says so.
  await page.waitForSelector('tr[data-node="ui-node"] .state.leader');
  const maxthreads = page.locator(".edit-maxthreads").first();
  await maxthreads.fill("3");
  await maxthreads.press("Enter");
  await maxthreads.blur();
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes("maxthreads set to 3"));
  await shot("nodes");

  // Upload a component: its name comes from the file name, its digest goes along.
  await page.click("#nav-plugins");
  await page.waitForSelector("#plugin-upload");
  await page.setInputFiles("#plugin-file", component);
  if ((await page.inputValue("#plugin-name")) !== "demo") throw new Error("plugin name not taken from the file name");
  await page.click("#plugin-push");
  await page.waitForFunction(() => document.querySelector("#message").textContent.startsWith("uploaded demo@sha256:"), null, { timeout: 120000 });
  await page.waitForSelector('tr[data-plugin="demo"] .delete-plugin');
  const stored = await api("/plugins/demo");
  if (stored.versions?.length !== 1) throw new Error("uploaded plugin not stored: " + JSON.stringify(stored));
  await shot("plugins");

  await page.click("#nav-tasks");
  await page.waitForSelector("#task-search");
  await page.selectOption("#search-queue", "done-q");
  await page.click('#task-search button[type="submit"]');
  await page.waitForSelector(`a.task-link[href="#/task/${taskId}"]`);
  await shot("task-search");
  // A refresh of the list whose answers arrive after the user has moved on to a task does
  // not draw the list over the task: the refresh's GET /tasks is held until the task's page
  // is drawn, then let through.
  let releaseList;
  const listHeld = new Promise((r) => { releaseList = r; });
  let listAsked;
  const listRefreshAsked = new Promise((r) => { listAsked = r; });
  const listUrl = (url) => url.pathname === "/tasks" && url.searchParams.get("limit") === "25";
  await page.route(listUrl, async (route) => {
    listAsked();
    await listHeld;
    await route.continue();
  });
  await listRefreshAsked;
  const monitoring = () => page.waitForRequest((r) => new URL(r.url()).pathname === "/monitoring");
  const taskDrawn = monitoring();
  await page.click(`a.task-link[href="#/task/${taskId}"]`);
  await taskDrawn;
  // The GridFS-backed output streams in after the page is drawn.
  await page.waitForSelector('#task-stdout[data-complete="1"]');
  const listEnded = monitoring();
  releaseList();
  await listEnded;
  await page.unroute(listUrl);
  if (!(await page.isVisible("#task-stdout"))) throw new Error("a refresh of the task list drew over the task's page");
  const stdout = await page.textContent("#task-stdout");
  if (stdout !== expected.concat("\n").repeat(20000)) throw new Error("streamed stdout is not the whole file: " + stdout.length + " characters");
  if (!stdout.includes(expected)) throw new Error("task stdout does not show the output: " + stdout.slice(0, 200));
  const status = await page.textContent("#task-status");
  if (!status.includes("succeeded")) throw new Error("task status shown as " + status);
  await shot("task-output");

  // A task scheduled for later is cancelled from its page.
  const later = (await post("/tasks", { queue: "browser-q", params: [{}], run_at: "1h" })).ids[0];
  await page.goto(base + "/#/task/" + later);
  await page.waitForFunction(() => (document.querySelector("#task-status")?.textContent || "").includes("scheduled"));
  if (!(await page.isVisible("#task-run-at"))) throw new Error("a scheduled task's page does not show its time");
  await page.click("#task-cancel");
  await page.waitForFunction(() => (document.querySelector("#task-status")?.textContent || "").includes("cancelled"));
  const cancelled = await api("/tasks/" + later);
  if (cancelled.status !== -5 || cancelled.stop.reason !== "from the browser") throw new Error("cancel: " + JSON.stringify(cancelled));
  await shot("task-cancelled");

  // A running task is killed from its page: the DEN stops the plugin and the task fails.
  const long = (await post("/tasks", { queue: "browser-q", params: [{ sleep_ms: 120000 }] })).ids[0];
  await page.goto(base + "/#/task/" + long);
  await page.waitForSelector("#task-kill", { timeout: 120000 });
  await page.waitForFunction(() => (document.querySelector("#task-status")?.textContent || "").includes("running"), null, { timeout: 120000 });
  // demo reports (0 %, "starting") before it waits: the page shows it as a progress bar.
  await page.waitForSelector('#task-progress progress[value="0"]', { timeout: 120000 });
  if (!(await page.textContent("#task-progress")).includes("starting")) throw new Error("progress text: " + (await page.textContent("#task-progress")));
  await shot("task-progress");
  await page.click("#task-kill");
  await page.waitForFunction(() => (document.querySelector("#task-status")?.textContent || "").includes("failed"), null, { timeout: 120000 });
  const stderr = await page.textContent("#task-stderr");
  if (!stderr.includes("killed by api") || !stderr.includes("from the browser")) throw new Error("killed task's stderr: " + stderr);
  await shot("task-killed");

  // The failed task runs again from its page; its killed run is listed as attempt 1.
  await page.click("#task-retry");
  await page.waitForSelector("#task-attempts tbody tr", { timeout: 120000 });
  const attempt = await page.textContent("#task-attempts tbody tr");
  if (!attempt.includes("failed") || !attempt.includes("retried by hand by api: from the browser")) throw new Error("attempt row: " + attempt);
  const again = await api("/tasks/" + long);
  if (again.status > 0 || again.attempts.length !== 1) throw new Error("retried task: " + JSON.stringify(again));
  await shot("task-retried");

  // A DAG: a → (b, c) → d. b's page lists what it waits for and what waits for it, and
  // draws them; once a succeeded the graph shows it so.
  const dag = (await post("/tasks", { queue: "browser-q", tasks: [
    { params: { message: "a", sleep_ms: 1500 } },
    { params: { message: "b" }, after: [{ ref: 0 }] },
    { params: { message: "c" }, after: [{ ref: 0 }] },
    { params: { message: "d" }, after: [{ ref: 1 }, { ref: 2 }] },
  ] })).ids;
  await page.goto(base + "/#/task/" + dag[1]);
  await page.waitForSelector("#task-graph .node.self");
  const graph = await page.evaluate(() => ({
    parents: [...document.querySelectorAll("#task-graph .node.parent")].map((n) => n.textContent),
    children: [...document.querySelectorAll("#task-graph .node.child")].map((n) => n.textContent),
    listed: [...document.querySelectorAll("#task-parents a")].map((a) => a.getAttribute("href")),
    waiting: document.querySelector("#task-parents")?.textContent || "",
  }));
  if (graph.parents.length !== 1 || !graph.parents[0].startsWith(dag[0].slice(0, 20))) throw new Error("graph parents: " + JSON.stringify(graph));
  if (graph.children.length !== 1 || !graph.children[0].startsWith(dag[3].slice(0, 20))) throw new Error("graph children: " + JSON.stringify(graph));
  if (graph.listed[0] !== "#/task/" + dag[0] || !graph.waiting.includes("waiting for it")) throw new Error("parents list: " + JSON.stringify(graph));
  if (!(await page.textContent("#task-status")).includes("blocked")) throw new Error("b's status: " + (await page.textContent("#task-status")));
  await shot("task-dag-blocked");
  await page.waitForFunction(() => (document.querySelector("#task-status")?.textContent || "").includes("succeeded"), null, { timeout: 120000 });
  await page.waitForSelector('#task-graph .node.parent[data-status="1"]');
  await shot("task-dag-done");

  // QueueBalance from its page: a refusal is shown; once saved, the leader's share of the
  // queue and the limit in force show there and on the queues page.
  await post("/tasks", { queue: "browser-q", params: [{ sleep_ms: 4000 }, { sleep_ms: 4000 }, { sleep_ms: 4000 }] });
  await page.click("#nav-balance");
  await page.waitForSelector("#balance-edit");
  // An edit begun while an auto-refresh waits for its answers survives the refresh: the
  // refresh's GET /balance is held until the text is typed, then let through.
  let release;
  const held = new Promise((r) => { release = r; });
  let asked;
  const refreshAsked = new Promise((r) => { asked = r; });
  const balanceUrl = (url) => url.pathname === "/balance";
  await page.route(balanceUrl, async (route) => {
    if (route.request().method() !== "GET") return route.continue();
    asked();
    await held;
    await route.continue();
  });
  await refreshAsked;
  const typed = JSON.stringify({ max_tasks: { "* 00:00": 3 }, queues: [["browser-q"]] });
  await page.fill("#balance-edit", typed);
  await page.locator("#balance-save").focus();
  // The refresh ends with its GET /monitoring, whether it drew the page or not.
  const refreshEnded = page.waitForRequest((r) => new URL(r.url()).pathname === "/monitoring");
  release();
  await refreshEnded;
  await page.unroute(balanceUrl);
  if ((await page.inputValue("#balance-edit")) !== typed) throw new Error("an auto-refresh overwrote the balance being edited: " + (await page.inputValue("#balance-edit")));
  await page.fill("#balance-edit", JSON.stringify({ max_tasks: { "* 00:00": 2 }, queues: [["nope"]] }));
  await page.click("#balance-save");
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes('"nope"'));
  // A refused save keeps what was typed, to be corrected.
  if (!(await page.inputValue("#balance-edit")).includes("nope")) throw new Error("a refused save dropped the draft: " + (await page.inputValue("#balance-edit")));
  await page.fill("#balance-edit", JSON.stringify({ max_tasks: { "* 00:00": 2 }, queues: [["browser-q"]] }));
  await page.click("#balance-save");
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes("QueueBalance saved"));
  // The leader writes the share on its next duty round; a loaded machine delays it.
  for (const deadline = Date.now() + 120000; ;) {
    await page.reload();
    await page.waitForSelector("#balance-lanes");
    const seen = await page.evaluate(() => ({
      share: document.querySelector('.lane-queue[data-queue="browser-q"] .share')?.textContent.trim(),
      limit: document.querySelector("#balance-limit")?.textContent.trim(),
    }));
    if (seen.share === "2" && seen.limit === "2") break;
    if (Date.now() > deadline) throw new Error("the balance page never showed the leader's share: " + JSON.stringify(seen));
    await page.waitForTimeout(500);
  }
  await shot("balance");
  await page.click("#nav-queues");
  await page.waitForSelector('tr[data-queue="browser-q"] .share');
  if (!(await page.textContent('tr[data-queue="browser-q"] .share')).includes("balance share")) throw new Error("queues page share");

  // Schedules: listed with their next occurrences; paused and resumed from the page.
  const sched = await post("/schedules", { name: "browser-s", queue: "browser-q", every: "1h", params: { message: "hourly" } });
  if (sched.next?.length !== 5) throw new Error("schedule not created: " + JSON.stringify(sched));
  await page.click("#nav-schedules");
  await page.waitForSelector('tr[data-schedule="browser-s"] .next');
  if ((await page.textContent('tr[data-schedule="browser-s"] .schedule-state')).trim() !== "active") throw new Error("schedule state");
  await shot("schedules");
  await page.click('tr[data-schedule="browser-s"] .toggle-schedule');
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes("paused browser-s"));
  await page.waitForFunction(() => document.querySelector('tr[data-schedule="browser-s"] .schedule-state')?.textContent.trim() === "paused");
  if ((await api("/schedules/browser-s")).paused !== true) throw new Error("schedule not paused");
  await page.click('tr[data-schedule="browser-s"] .toggle-schedule');
  await page.waitForFunction(() => document.querySelector("#message").textContent.includes("resumed browser-s"));
  if ((await api("/schedules/browser-s")).paused !== false) throw new Error("schedule not resumed");
  if (errors.length) throw new Error("page errors: " + errors.join("; "));
  console.log(JSON.stringify({ ok: true, screenshots: step, submitted }));
} catch (e) {
  await shot("failure").catch(() => {});
  console.error(String(e && e.stack || e));
  process.exitCode = 1;
} finally {
  await close();
}
