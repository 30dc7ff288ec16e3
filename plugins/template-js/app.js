// A Disbatch plugin template in JavaScript: greets `params.name`.
//
// Copy this directory, rename it, and replace the spec and the function with your own.
// Build it with `./build.sh` and try it:
// runner exec plugins/target/wasm32-wasip2/release/template-js.wasm --params '{"name":"you"}'

import { optional, plugin, progress, required, SUCCEEDED, TaskError } from "disbatch-plugin";

/**
 * The task's params, checked against the spec below before the function is called: a
 * missing or unknown field, or a value of the wrong type, fails the task with
 * `invalid params: …` naming the field.
 * @typedef {object} Params
 * @property {string} name  Who to greet.
 * @property {number} times How many times (default 1).
 */

/**
 * Runs one task. What it writes with console.log and console.error is the task's stdout
 * and stderr. It returns the task's status (SUCCEEDED, FAILED or your own, up to
 * 4294967295); throwing TaskError(message) fails the task with that message added to its
 * stderr. It may be `async`.
 * @param {Params} params
 */
function greet(params) {
  if (params.times < 1) throw new TaskError("times must be at least 1");
  progress(0, "starting");
  for (let i = 0; i < params.times; i++) {
    console.log(`hello, ${params.name}!`);
    // Progress is cheap: report it as often as is useful.
    progress(((i + 1) * 100) / params.times, "greeting");
  }
  console.error(`greeted ${params.name} ${params.times} time(s)`);
  return SUCCEEDED;
}

export const run = plugin({ name: required("string"), times: optional("integer", 1) }, greet);
