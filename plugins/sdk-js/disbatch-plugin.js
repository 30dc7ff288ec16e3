// The Disbatch plugin SDK for JavaScript.
//
// A Disbatch plugin is a WebAssembly component implementing the `plugin` world of the
// repository's `wit/plugin.wit`. `jco componentize` (ComponentizeJS) builds one from an ES
// module that exports `run` (`plugins/build-py-js` installs it and builds). With this
// module a plugin is one function:
//
//     import { plugin, progress, required, SUCCEEDED } from "disbatch-plugin";
//
//     export const run = plugin({ name: required("string"), times: 1 }, (params) => {
//       progress(50, "greeting");
//       console.log(`hello, ${params.name}`);
//       return SUCCEEDED;
//     });
//
// The contract:
//
// - `plugin(spec, fn)` checks the task's params against `spec` before `fn` runs: a
//   missing or unknown field, or a value of the wrong type, fails the task with
//   `invalid params: …` naming the field. `plugin(fn)` passes the parsed JSON as it is.
// - `fn` returns (or resolves to: it may be `async`) the task's status, an integer from 1
//   to 4294967295 (`SUCCEEDED`, `FAILED` or a larger value of your own). Anything else
//   (`undefined`, a negative or fractional number, a string…) fails the task with
//   `invalid status …`. `0` is passed on to the host, which rejects it and fails the task.
// - `throw new TaskError(message)` fails the task with `message` added to its stderr.
//   Anything else thrown fails it with `<Error name>: <message>`, the stack printed to
//   stderr first.
// - `console.log` and `console.error` write the task's stdout and stderr.
// - `progress(percent, info)` reports progress; `await sleep(ms)` waits on the clock.
// - `submit(queue, params)` submits a follow-up task to a queue the task's queue grants in
//   its `sandbox.submit`; it is created only if the task succeeds. A refused call throws
//   a `TaskError` with the host's reason.
//
// Build with `--disable http fetch-event` (plugins/build-py-js does): the host links the
// WASI 0.2 interfaces but not `wasi:http`, and a component importing it is refused.

import { progress as hostProgress, submit as hostSubmit } from "disbatch:plugin/host@0.2.0";

/** Status of a task that succeeded. */
export const SUCCEEDED = 1;
/** Status of a task that failed. */
export const FAILED = 2;
/** The largest status a task can have (a WIT `u32`). */
export const MAX_STATUS = 4294967295;

/** Throw it to fail the task with its message added to the task's stderr. */
export class TaskError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = "TaskError";
  }
}

/** The task's params do not fit the plugin's spec. */
export class ParamsError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = "ParamsError";
  }
}

/**
 * Reports progress: `percent` (0 to 100) and/or a short message `info`; either may be
 * `undefined` or `null`. The host clamps the percentage, ignores NaN, keeps at most 1 KiB
 * of `info` and only the latest reports, so calling this often is fine.
 * @param {number | null} [percent]
 * @param {string | null} [info]
 */
export function progress(percent, info) {
  hostProgress(percent == null ? undefined : Number(percent), info == null ? undefined : String(info));
}

/**
 * Submits a follow-up task of `queue` (its name or id) with `params`, an object (or its
 * JSON text). The host records it and creates it only if this task succeeds (status 1),
 * keyed `submit:<task id>:<n>` and running after this task. Throws a `TaskError` with the
 * host's reason when the call is refused: the queue is not in the task's
 * `sandbox.submit`, a bound was reached (`sandbox.submit_max` follow-ups per task, 1 MiB of
 * params each, 16 MiB per task) or the params are not an object. A refused call submits
 * nothing; uncaught, it fails the task with that reason.
 * @param {string} queue
 * @param {object | string} params
 */
export function submit(queue, params) {
  const text = typeof params === "string" ? params : JSON.stringify(params);
  try {
    hostSubmit(String(queue), text);
  } catch (e) {
    const reason = e && typeof e === "object" && "payload" in e ? e.payload : e;
    throw new TaskError(typeof reason === "string" ? reason : String(reason));
  }
}

/**
 * Waits `ms` milliseconds on the WASI clock (`await sleep(ms)` in an `async` function).
 * @param {number} ms
 * @returns {Promise<void>}
 */
export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * The type names of a params spec.
 * @typedef {"string" | "number" | "integer" | "boolean" | "array" | "object" | "any"} FieldType
 */

/**
 * One field of a params spec: made by `required` or `optional`, or a plain value, which
 * is the field's default and gives its type ("string", "number", "boolean", "array",
 * "object"; `null` for "any").
 * @typedef {{ type: FieldType, required: boolean, value?: unknown } | string | number | boolean | null | unknown[] | object} Field
 */

const FIELD = Symbol("disbatch-plugin field");
const TYPES = ["string", "number", "integer", "boolean", "array", "object", "any"];

/**
 * A field the params must have.
 * @param {FieldType} type
 */
export function required(type) {
  return field(type, true, undefined);
}

/**
 * A field the params may have; `value` (default `undefined`) when they do not.
 * @param {FieldType} type
 * @param {unknown} [value]
 */
export function optional(type, value) {
  return field(type, false, value);
}

function field(type, isRequired, value) {
  if (!TYPES.includes(type)) {
    throw new TypeError(`unknown field type ${JSON.stringify(type)} (the types are: ${TYPES.join(", ")})`);
  }
  return { [FIELD]: true, type, required: isRequired, value };
}

/** The type of a JSON value as a spec names it. */
function typeOf(value) {
  if (value === null) return "any";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

function describe(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  switch (typeof value) {
    case "string": {
      const shown = value.length <= 40 ? value : `${value.slice(0, 40)}…`;
      return `string ${JSON.stringify(shown)}`;
    }
    case "number":
      return `number ${value}`;
    case "boolean":
      return `boolean ${value}`;
    default:
      return "an object";
  }
}

const EXPECTED = {
  string: "a string",
  number: "a number",
  integer: "an integer",
  boolean: "true or false",
  array: "an array",
  object: "an object",
};

function fits(value, type) {
  switch (type) {
    case "any":
      return true;
    case "integer":
      return Number.isSafeInteger(value);
    case "array":
      return Array.isArray(value);
    case "object":
      return value !== null && typeof value === "object" && !Array.isArray(value);
    default:
      return typeof value === type;
  }
}

/**
 * Parses the JSON `text` and checks it against `spec`: every key of the params must be a
 * field of `spec`, required fields must be present, and each value must have its field's
 * type; absent optional fields get their default. Throws `ParamsError` naming the field.
 * @param {string} text
 * @param {Record<string, Field>} spec
 * @returns {Record<string, any>}
 */
export function parseParams(text, spec) {
  let params;
  try {
    params = JSON.parse(text);
  } catch (e) {
    throw new ParamsError(`not valid JSON: ${e instanceof Error ? e.message : e}`);
  }
  if (!fits(params, "object")) {
    throw new ParamsError(`expected an object, got ${describe(params)}`);
  }
  const names = Object.keys(spec);
  for (const key of Object.keys(params)) {
    if (!Object.hasOwn(spec, key)) {
      throw new ParamsError(`unknown field ${JSON.stringify(key)} (the fields are: ${names.join(", ")})`);
    }
  }
  const out = {};
  for (const name of names) {
    const f = spec[name] !== null && typeof spec[name] === "object" && spec[name][FIELD]
      ? spec[name]
      : { type: typeOf(spec[name]), required: false, value: spec[name] };
    if (!Object.hasOwn(params, name)) {
      if (f.required) throw new ParamsError(`missing field ${JSON.stringify(name)}`);
      out[name] = f.value;
      continue;
    }
    const value = params[name];
    // `null` stands for "absent" in an optional field without a default.
    const absent = value === null && !f.required && f.value === undefined;
    if (!absent && !fits(value, f.type)) {
      throw new ParamsError(`field ${JSON.stringify(name)}: expected ${EXPECTED[f.type]}, got ${describe(value)}`);
    }
    out[name] = absent ? undefined : value;
  }
  return out;
}

/** Why `status` cannot be returned, or `undefined`. */
function statusProblem(status) {
  if (typeof status === "bigint" && status >= 0n && status <= BigInt(MAX_STATUS)) return undefined;
  if (Number.isInteger(status) && status >= 0 && status <= MAX_STATUS) return undefined;
  let shown;
  if (typeof status === "number" || typeof status === "bigint") shown = String(status);
  else if (typeof status === "string") shown = `${JSON.stringify(status)} (a string)`;
  else if (status === undefined) shown = "undefined (nothing was returned)";
  else shown = `${safeJson(status)} (${status === null ? "null" : typeof status})`;
  return `invalid status ${shown}: the plugin function must return an integer from 1 to ${MAX_STATUS} ` +
    "(SUCCEEDED, FAILED or your own)";
}

function safeJson(value) {
  try {
    const text = JSON.stringify(value);
    if (text !== undefined) return text;
  } catch {
    // fall through
  }
  return String(value);
}

/** The `err` message for something thrown, its stack printed to stderr first. */
function failureMessage(thrown) {
  try {
    if (thrown instanceof TaskError) return String(thrown.message) || "the task failed";
    if (thrown instanceof Error) {
      const head = thrown.message ? `${thrown.name}: ${thrown.message}` : String(thrown.name);
      // The stack without the frames of the component's generated glue.
      const stack = String(thrown.stack ?? "")
        .split("\n")
        .filter((line) => line && !line.includes("/sources/initializer.js"))
        .join("\n");
      console.error(stack ? `${head}\n${stack}` : head);
      return head;
    }
    if (typeof thrown === "string") return thrown;
    return `uncaught ${safeJson(thrown)}`;
  } catch {
    return "uncaught exception (it cannot be shown)";
  }
}

/**
 * Turns `fn` into the component's `run` export: `export const run = plugin(spec, fn)`.
 *
 * With a `spec`, `fn` gets the params checked against it (see `parseParams`); without,
 * the parsed JSON. `fn` returns a status or a promise of one.
 * @template {Record<string, any>} P
 * @param {Record<string, Field> | ((params: any) => number | Promise<number>)} spec
 * @param {(params: P) => number | Promise<number>} [fn]
 * @returns {(params: string) => Promise<number>}
 */
export function plugin(spec, fn) {
  if (typeof spec === "function" && fn === undefined) {
    fn = spec;
    spec = undefined;
  }
  if (typeof fn !== "function") {
    throw new TypeError("plugin(spec, fn): fn must be the function that runs a task");
  }
  return async function run(text) {
    let params;
    try {
      params = spec === undefined ? JSON.parse(text) : parseParams(text, spec);
    } catch (e) {
      // A string thrown out of `run` is its `err`; anything else would trap and lose it.
      throw `invalid params: ${e instanceof Error ? e.message : e}`;
    }
    let status;
    try {
      status = await fn(params);
    } catch (e) {
      throw failureMessage(e);
    }
    const problem = statusProblem(status);
    if (problem !== undefined) throw problem;
    return Number(status);
  };
}
