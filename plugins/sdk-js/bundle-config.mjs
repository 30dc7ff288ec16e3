// The Rolldown settings `jco componentize --bundle` merges for a Disbatch plugin: the
// plugin imports this SDK as "disbatch-plugin", and the component's own imports
// (`disbatch:…`, `wasi:…`) stay imports of the component.
import { fileURLToPath } from "node:url";

export default {
  external: [/^disbatch:/, /^wasi:/],
  resolve: {
    alias: {
      "disbatch-plugin": fileURLToPath(new URL("./disbatch-plugin.js", import.meta.url)),
    },
  },
};
