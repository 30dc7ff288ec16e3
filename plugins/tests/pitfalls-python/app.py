"""`pitfalls-python`: a test fixture for what the Python SDK turns into clear failures.

Params: `raise`, a message raised as a ValueError; `task_error`, a message raised as a
TaskError; `exit`, a code passed to sys.exit; `status`, any JSON value returned as the
status (the SDK refuses what is not an int from 0 to 4294967295); `none`, true to return
None; `submit`, a list of `{"queue": …, "params": …}` submitted in order (a refused one
raises the SDK's SubmitError). With none of them it returns 1.
"""

import sys

from disbatch_plugin import TaskError, plugin, submit


@plugin
def run(params: dict) -> int:
    print("pitfalls: started")
    for s in params.get("submit", []):
        submit(s["queue"], s["params"])
    if "raise" in params:
        raise ValueError(params["raise"])
    if "task_error" in params:
        raise TaskError(params["task_error"])
    if "exit" in params:
        sys.exit(params["exit"])
    if params.get("none"):
        return None
    return params.get("status", 1)
