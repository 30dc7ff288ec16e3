// Shared by the peer scripts: arguments, finish timestamps and the one JSON line each prints.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";

/** `--n N --concurrency C` plus the script's own string options. */
export function args(extra) {
  const { values } = parseArgs({
    options: {
      n: { type: "string" },
      concurrency: { type: "string", default: "8" },
      ...Object.fromEntries(extra.map((k) => [k, { type: "string" }])),
    },
  });
  const n = Number(values.n);
  const concurrency = Number(values.concurrency);
  if (!Number.isInteger(n) || n < 2) fail(`--n must be an integer ≥ 2, got ${values.n}`);
  if (!Number.isInteger(concurrency) || concurrency < 1)
    fail(`--concurrency must be a positive integer, got ${values.concurrency}`);
  for (const k of extra) if (!values[k]) fail(`--${k} is required`);
  return { ...values, n, concurrency };
}

export function fail(message) {
  console.error(`peer bench: ${message}`);
  process.exit(2);
}

/** The installed version of `pkg`, from its package.json. */
export function version(pkg) {
  const require = createRequire(import.meta.url);
  let dir = require.resolve(pkg);
  for (;;) {
    const up = dir.slice(0, dir.lastIndexOf("/"));
    if (up === dir || !up) return "unknown";
    dir = up;
    try {
      const meta = JSON.parse(readFileSync(`${dir}/package.json`, "utf8"));
      if (meta.name === pkg) return meta.version;
    } catch {
      // not the package root yet
    }
  }
}

/** Wall-clock milliseconds with sub-millisecond resolution. */
export const now = () => performance.timeOrigin + performance.now();

/**
 * Counts finished jobs; `done` resolves once `n` have finished. `rate` is taken as the
 * DEN's: (finished − 1) over the span between the first and the last finish; `drain_rate`
 * is finished over the span from `start()` to the last finish.
 */
export function finishes(n) {
  let count = 0;
  let started = 0;
  let first = 0;
  let last = 0;
  let resolve;
  const done = new Promise((r) => (resolve = r));
  return {
    done,
    /** Marks the moment the workers start (after the jobs were added). */
    start() {
      started = now();
    },
    record() {
      const t = now();
      if (count === 0) first = t;
      last = t;
      count += 1;
      if (count === n) resolve();
    },
    report(fields) {
      const span = (last - first) / 1e3;
      const rate = count > 1 && span > 0 ? (count - 1) / span : 0;
      const whole = (last - started) / 1e3;
      const drain_rate = whole > 0 ? count / whole : 0;
      console.log(
        JSON.stringify({ ...fields, finished: count, start_ms: started, first_ms: first, last_ms: last, rate, drain_rate }),
      );
    },
  };
}

/** Rejects after `ms` so that a stuck peer ends the run with a clear message. */
export function deadline(ms, what) {
  return new Promise((_, reject) => {
    const t = setTimeout(() => reject(new Error(`${what}: not done in ${ms / 1e3} s`)), ms);
    t.unref();
  });
}
