"""`demo-python`: the example plugin, in Python.

Params (all optional): `message` (default "hello") printed `repeat` times (default 1) to
stdout, one per line; `stderr`, a string printed to stderr; `sleep_ms`, a wait before
anything else (a WASI clock wait, not a busy loop); `status`, the status to return
(default 1; passed through as given, so 0 shows how the host rejects it). Unknown params
fail the task with an error naming the field.
"""

import sys
import time
from dataclasses import dataclass
from typing import Optional

from disbatch_plugin import SUCCEEDED, plugin, progress


@dataclass
class Params:
    message: str = "hello"
    repeat: int = 1
    stderr: Optional[str] = None
    sleep_ms: Optional[int] = None
    status: int = SUCCEEDED


@plugin
def run(p: Params) -> int:
    progress(0, "starting")
    if p.sleep_ms:
        time.sleep(p.sleep_ms / 1000)
    line = p.message + "\n"
    # Whole blocks of lines, about 64 KiB each: one write per block, not per line.
    per_block = max(1, 65536 // max(1, len(line.encode())))
    left = p.repeat
    while left > 0:
        n = min(left, per_block)
        sys.stdout.write(line * n)
        left -= n
    sys.stdout.flush()
    if p.stderr is not None:
        print(p.stderr, file=sys.stderr)
    progress(100, "done")
    return p.status
