// Agenda (MongoDB backend) draining N no-op jobs with C at a time:
//   node agenda.mjs --uri mongodb://… --db NAME --n N --concurrency C
// Prints one JSON line (see common.mjs). The jobs are created with `agenda.now` before
// the processor starts, so only the draining is timed.
import { Agenda } from "agenda";
import { MongoBackend } from "@agendajs/mongo-backend";
import { MongoClient } from "mongodb";
import { args, deadline, finishes, version } from "./common.mjs";

const a = args(["uri", "db"]);
const client = await MongoClient.connect(a.uri, { monitorCommands: true });
// Database commands sent while draining (from the processor's start to the last finish).
const commands = {};
let counting = false;
// Keyed `<command> <collection>` as the bench keys the DEN's (a getMore names its
// collection apart; `-` for a command on no collection).
client.on("commandStarted", (e) => {
  if (!counting) return;
  const target = e.command[e.commandName];
  const collection = typeof target === "string" ? target : (e.command.collection ?? "-");
  const key = `${e.commandName} ${collection}`;
  commands[key] = (commands[key] ?? 0) + 1;
});
const db = client.db(a.db);
await db.dropDatabase();
const agenda = new Agenda({
  backend: new MongoBackend({ mongo: db }),
  processEvery: 100,
  maxConcurrency: a.concurrency,
  defaultConcurrency: a.concurrency,
});
const jobs = finishes(a.n);
agenda.define("noop", async () => {}, { concurrency: a.concurrency });
agenda.on("complete:noop", () => jobs.record());
agenda.on("fail", (error) => {
  console.error(`peer bench: an Agenda job failed: ${error}`);
  process.exit(1);
});
await agenda.ready;
for (let i = 0; i < a.n; i += 100) {
  const batch = [];
  for (let k = i; k < Math.min(a.n, i + 100); k++) batch.push(agenda.now("noop", { k }));
  await Promise.all(batch);
}
jobs.start();
counting = true;
await agenda.start();
await Promise.race([jobs.done, deadline(900_000, `Agenda draining ${a.n} jobs`)]);
counting = false;
await agenda.stop(false);
jobs.report({
  peer: "agenda",
  version: version("agenda"),
  backend: `@agendajs/mongo-backend ${version("@agendajs/mongo-backend")}`,
  driver: `mongodb ${version("mongodb")}`,
  n: a.n,
  concurrency: a.concurrency,
  settings: `maxConcurrency=defaultConcurrency=${a.concurrency}, processEvery=100ms, lockLimit=0`,
  commands_per_job: Object.fromEntries(Object.entries(commands).map(([k, v]) => [k, v / a.n])),
});
await db.dropDatabase();
await client.close();
// Agenda leaves timers behind after stop(); the run is over.
process.exit(0);
