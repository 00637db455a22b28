"""Named failpoints: places where a test may kill the control plane outright.

`KEELWAY_FAILPOINTS=name[,name@N...]` arms them: a bare name dies at its first hit,
`name@N` at its N-th hit in this process. An armed failpoint SIGKILLs this process: it
never raises, because an exception would run `finally` blocks and cleanup that a real
crash would not, and the tests would then prove the wrong thing.

`KEELWAY_FAILPOINTS_TRACE=path` appends every hit to `path`, one per line: its name, a
tab, and the code path that reached it (a digest of the keelway frames on the stack).
The crash matrix runs a scenario once with it to learn every point the scenario passes,
then once per point with that point armed; a point whose name and code path a loop
already passed, with nothing new hit since, is run once (tests/reconcile).

Every durable write and every external effect has one failpoint before it and one
after it; `KNOWN` lists the declared names.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections import Counter
from types import FrameType

KNOWN: set[str] = set()
_hits: Counter[str] = Counter()


def declare(*names: str) -> None:
    KNOWN.update(names)


def _armed() -> dict[str, int]:
    raw = os.environ.get("KEELWAY_FAILPOINTS", "")
    armed: dict[str, int] = {}
    for part in raw.split(","):
        name, _, nth = part.strip().partition("@")
        if name:
            armed[name] = int(nth) if nth.isdigit() else 1
    return armed


def hit(name: str) -> None:
    """Die here, now, if `name` is armed for this hit."""
    if not os.environ.get("KEELWAY_FAILPOINTS") and not os.environ.get(
            "KEELWAY_FAILPOINTS_TRACE"):
        return  # the production path: two dict lookups
    _hits[name] += 1
    trace = os.environ.get("KEELWAY_FAILPOINTS_TRACE")
    if trace:
        with open(trace, "a") as handle:
            handle.write(f"{name}\t{_code_path()}\n")
    if _armed().get(name) == _hits[name]:
        os.kill(os.getpid(), signal.SIGKILL)


def _code_path() -> str:
    """Where this hit comes from: every keelway frame on the stack, by file and line."""
    frames = []
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        where = frame.f_code.co_filename
        if "keelway" in where:
            frames.append(f"{where.rsplit('keelway', 1)[1]}:{frame.f_lineno}")
        frame = frame.f_back
    return hashlib.sha1("|".join(frames).encode()).hexdigest()[:12]
