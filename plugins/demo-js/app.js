// `demo-js`: the example plugin, in JavaScript.
//
// Params (all optional): `message` (default "hello") printed `repeat` times (default 1)
// to stdout, one per line; `stderr`, a string printed to stderr; `sleep_ms`, a wait before
// anything else (a WASI clock wait, not a busy loop); `status`, the status to return
// (default 1; passed through as given, so 0 shows how the host rejects it). Unknown params
// fail the task with an error naming the field.

import { optional, plugin, progress, sleep, SUCCEEDED } from "disbatch-plugin";

const spec = {
  message: "hello",
  repeat: optional("integer", 1),
  stderr: optional("string"),
  sleep_ms: optional("integer"),
  status: optional("integer", SUCCEEDED),
};

/**
 * @param {{ message: string, repeat: number, stderr?: string, sleep_ms?: number, status: number }} p
 */
async function demo(p) {
  progress(0, "starting");
  if (p.sleep_ms) await sleep(p.sleep_ms);
  // Whole blocks of lines, about 64 KiB each: one write per block, not per line.
  const perBlock = Math.max(1, Math.floor(65536 / Math.max(1, p.message.length + 1)));
  for (let left = p.repeat; left > 0; left -= perBlock) {
    console.log(Array(Math.min(left, perBlock)).fill(p.message).join("\n"));
  }
  if (p.stderr !== undefined) console.error(p.stderr);
  progress(100, "done");
  return p.status;
}

export const run = plugin(spec, demo);
