// plainjob (better-sqlite3) draining N no-op jobs with C workers in one process:
//   node plainjob.mjs --path FILE --n N --concurrency C
// Prints one JSON line (see common.mjs). plainjob's worker runs one job at a time, so C
// workers share the queue's connection. The jobs are added (one transaction) first.
import Database from "better-sqlite3";
import { better, defineQueue, defineWorker } from "plainjob";
import { args, deadline, finishes, version } from "./common.mjs";

const a = args(["path"]);
const quiet = { error: console.error, warn: console.error, info() {}, debug() {} };
const queue = defineQueue({ connection: better(new Database(a.path)), logger: quiet });
queue.addMany("noop", Array.from({ length: a.n }, (_, k) => ({ k })));
const jobs = finishes(a.n);
const workers = Array.from({ length: a.concurrency }, () =>
  defineWorker("noop", async () => {}, {
    queue,
    logger: quiet,
    pollIntervall: 10,
    onCompleted: () => jobs.record(),
    onFailed: (_job, error) => {
      console.error(`peer bench: a plainjob job failed: ${error}`);
      process.exit(1);
    },
  }),
);
jobs.start();
for (const w of workers) void w.start();
await Promise.race([jobs.done, deadline(900_000, `plainjob draining ${a.n} jobs`)]);
await Promise.all(workers.map((w) => w.stop()));
jobs.report({
  peer: "plainjob",
  version: version("plainjob"),
  driver: `better-sqlite3 ${version("better-sqlite3")}`,
  n: a.n,
  concurrency: a.concurrency,
  settings: `${a.concurrency} workers, pollIntervall=10ms, WAL, synchronous=NORMAL`,
});
queue.close();
process.exit(0);
