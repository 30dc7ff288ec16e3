"""A Disbatch plugin template in Python: greets `params.name`.

Copy this directory, rename it, and replace `Params` and `run` with your own. Build it
with `./build.sh` and try it:
`runner exec plugins/target/wasm32-wasip2/release/template-python.wasm --params '{"name":"you"}'`.
"""

import sys
from dataclasses import dataclass

from disbatch_plugin import SUCCEEDED, TaskError, plugin, progress


@dataclass
class Params:
    """The task's params, checked before `run` is called: a missing or unknown field, or a
    value of the wrong type, fails the task with `invalid params: …` naming the field."""

    name: str
    """Who to greet."""
    times: int = 1
    """How many times."""


@plugin
def run(params: Params) -> int:
    """Runs one task.

    What it prints is the task's stdout and stderr. It returns the task's status
    (SUCCEEDED, FAILED or your own, up to 4294967295); raising TaskError(message) fails
    the task with that message added to its stderr.
    """
    if params.times < 1:
        raise TaskError("times must be at least 1")
    progress(0, "starting")
    for i in range(params.times):
        print(f"hello, {params.name}!")
        # Progress is cheap: report it as often as is useful.
        progress((i + 1) * 100 / params.times, "greeting")
    print(f"greeted {params.name} {params.times} time(s)", file=sys.stderr)
    return SUCCEEDED
