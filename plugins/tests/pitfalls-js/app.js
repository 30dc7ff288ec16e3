// `pitfalls-js`: a test fixture for what the JavaScript SDK turns into clear failures.
//
// Params: `throw`, a message thrown as an Error; `throw_value`, any JSON value thrown as
// it is; `task_error`, a message thrown as a TaskError; `status`, any JSON value returned
// as the status (the SDK refuses what is not an integer from 0 to 4294967295); `undefined`,
// true to return nothing; `fetch`, a URL fetched first with the global `fetch`, its status
// and body printed; `submit`, a list of `{queue, params}` submitted in order (a refused one
// throws the SDK's TaskError). With none of them it returns 1.

import { plugin, submit, TaskError } from "disbatch-plugin";

export const run = plugin(async (params) => {
  console.log("pitfalls: started");
  for (const s of params.submit ?? []) submit(s.queue, s.params);
  if ("fetch" in params) {
    const r = await fetch(params.fetch);
    console.log(`fetched ${r.status}: ${await r.text()}`);
  }
  if ("throw" in params) throw new Error(params.throw);
  if ("throw_value" in params) throw params.throw_value;
  if ("task_error" in params) throw new TaskError(params.task_error);
  if (params.undefined) return undefined;
  return "status" in params ? params.status : 1;
});
