#!/usr/bin/env bash
# Builds this plugin into a component: plugins/target/wasm32-wasip2/release/<this
# directory's name>.wasm of the Disbatch repository, or the file given as the argument.
# Outside the repository, set DISBATCH_REPO to a checkout of it (the SDK, the WIT and the
# build tools come from there). The first build installs the tools (see plugins/build-py-js).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=${DISBATCH_REPO:-$(cd "$here/../.." && pwd)}
build="$repo/plugins/build-py-js"
if [ ! -x "$build" ]; then
    echo "build.sh: no Disbatch repository at $repo (it has no plugins/build-py-js): set DISBATCH_REPO to a checkout of it" >&2
    exit 1
fi
exec "$build" "$here" "${1:-$repo/plugins/target/wasm32-wasip2/release/$(basename "$here").wasm}"
