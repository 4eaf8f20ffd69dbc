"""Named fault points for the kill -9 tests: the process dies (or pauses) at a step chosen by env var.

``EO_FAULT_AT="<step>[:<n>]"`` acts the n-th time (default: the first) ``fault_point(step)`` is reached.
``EO_FAULT_ACTION`` is ``kill`` (SIGKILL itself, the default), ``kill-group`` (SIGKILL its whole process group:
a Spark driver dies with its JVM and spark-submit, as when the machine loses it) or ``pause:<seconds>``; a pause first writes
the step name to the file named by ``EO_FAULT_FILE`` so a test knows where the process stands, and ends
early when the test deletes that file (e.g. after it killed a broker or started a zombie's successor).
Unset in production, so each call costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

_reached: Counter[str] = Counter()


def fault_point(step: str) -> None:
    """Die or pause here if the environment asks for it (tests only)."""
    spec = os.environ.get("EO_FAULT_AT")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != step:
        return
    _reached[step] += 1
    if _reached[step] != int(nth or 1):
        return
    action = os.environ.get("EO_FAULT_ACTION", "kill")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "kill-group":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    elif action.startswith("pause:"):
        marker = os.environ.get("EO_FAULT_FILE")
        if marker:
            with open(marker, "w") as handle:
                handle.write(step)
        deadline = time.monotonic() + float(action.split(":", 1)[1])
        while time.monotonic() < deadline and (not marker or os.path.exists(marker)):
            time.sleep(0.05)
    else:
        raise ValueError(f"EO_FAULT_ACTION={action!r}: use 'kill', 'kill-group' or 'pause:<seconds>'.")
