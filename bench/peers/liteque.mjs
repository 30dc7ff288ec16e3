// liteque (better-sqlite3 + drizzle) draining N no-op jobs with concurrency C:
//   node liteque.mjs --path FILE --n N --concurrency C
// Prints one JSON line (see common.mjs). A job counts as finished when liteque's own
// `finalize` (which deletes a completed job) has returned.
import { buildDBClient, Runner, SqliteQueue } from "liteque";
import { args, deadline, finishes, version } from "./common.mjs";

const a = args(["path"]);
const db = buildDBClient(a.path, { runMigrations: true });
const queue = new SqliteQueue("noop", db, { defaultJobArgs: { numRetries: 0 }, keepFailedJobs: true });
for (let k = 0; k < a.n; k++) await queue.enqueue({ k });
const jobs = finishes(a.n);
const finalize = queue.finalize.bind(queue);
queue.finalize = async (id, allocation, status, ...rest) => {
  await finalize(id, allocation, status, ...rest);
  if (status !== "completed") {
    console.error(`peer bench: a liteque job ended ${status}`);
    process.exit(1);
  }
  jobs.record();
};
const runner = new Runner(queue, { run: async () => {} }, {
  concurrency: a.concurrency,
  pollIntervalMs: 10,
  timeoutSecs: 60,
});
jobs.start();
const running = runner.runUntilEmpty();
await Promise.race([jobs.done, deadline(900_000, `liteque draining ${a.n} jobs`)]);
runner.stop();
await running;
jobs.report({
  peer: "liteque",
  version: version("liteque"),
  driver: `better-sqlite3 ${version("better-sqlite3")}`,
  n: a.n,
  concurrency: a.concurrency,
  settings: `concurrency=${a.concurrency}, pollIntervalMs=10, WAL, synchronous=NORMAL`,
});
process.exit(0);
