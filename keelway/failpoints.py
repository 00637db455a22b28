"""Named failpoints: places where a test may kill the control plane outright.

`KEELWAY_FAILPOINTS=name[,name@N...]` arms them: a bare name dies at its first hit,
`name@N` at its N-th hit in this process. An armed failpoint SIGKILLs this process: it
never raises, because an exception would run `finally` blocks and cleanup that a real
crash would not, and the tests would then prove the wrong thing.

`KEELWAY_FAILPOINTS_ARM=path` arms them later: the spec is read from `path` at the
first hit after the file appears, and `name@N` counts hits from then on. The crash
matrix writes it once a scenario's setup is done, so hits the setup made (or a periodic
pass made meanwhile, more or fewer from run to run) never move the point.

`KEELWAY_FAILPOINTS_TRACE=path` appends every hit to `path`, one per line: its name, a
tab, and the code path that reached it (a digest of the keelway frames on the stack).
The crash matrix runs a scenario once with it to learn every point the scenario passes,
then once per point with that point armed; a point whose name and code path were
passed already (by a loop, or by an earlier scenario set up and checked the same way)
is run once (tests/reconcile).

Every durable write and every external effect has one failpoint before it and one
after it; `KNOWN` lists the declared names.

A pause point (`pause`) holds a window open rather than crash in it: `name=SECONDS` in
`KEELWAY_FAILPOINTS` makes every hit of `name` wait that long, in whichever of keelway's
processes passes it (the router's writes as the control plane's), for a test that must
act inside the window (a sweep racing a write in flight: `write.rename.NAME`, between a
write's temp file and its rename, keelway/durable.py). Pauses are never traced nor
crashed at: they are not effects, and a write's own failpoints are its caller's.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from collections import Counter
from types import FrameType

KNOWN: set[str] = set()
_hits: Counter[str] = Counter()
# Armed through KEELWAY_FAILPOINTS_ARM: the spec once its file appeared, and the hits
# counted since.
_late: dict[str, int] | None = None
_late_hits: Counter[str] = Counter()


def declare(*names: str) -> None:
    KNOWN.update(names)


def _armed() -> dict[str, int]:
    return _parse(os.environ.get("KEELWAY_FAILPOINTS", ""))


def _parse(raw: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for part in raw.split(","):
        if "=" in part:
            continue  # a pause (`_pauses`)
        name, _, nth = part.strip().partition("@")
        if name:
            armed[name] = int(nth) if nth.isdigit() else 1
    return armed


def _pauses(raw: str) -> dict[str, float]:
    pauses: dict[str, float] = {}
    for part in raw.split(","):
        name, sep, seconds = part.strip().rpartition("=")
        if sep and name:
            try:
                pauses[name] = float(seconds)
            except ValueError:
                continue  # not a pause: nothing waits on a spec it cannot read
    return pauses


def pause(name: str) -> None:
    """Wait here if `name` is armed as a pause (`name=SECONDS`); see the module header.
    Unset in production: one dict lookup."""
    raw = os.environ.get("KEELWAY_FAILPOINTS")
    if raw:
        seconds = _pauses(raw).get(name)
        if seconds:
            time.sleep(seconds)


def hit(name: str) -> None:
    """Die here, now, if `name` is armed for this hit."""
    global _late
    env = os.environ
    late = env.get("KEELWAY_FAILPOINTS_ARM")
    if not env.get("KEELWAY_FAILPOINTS") and not env.get("KEELWAY_FAILPOINTS_TRACE") and (
            not late):
        return  # the production path: three dict lookups
    _hits[name] += 1
    trace = env.get("KEELWAY_FAILPOINTS_TRACE")
    if trace:
        with open(trace, "a") as handle:
            handle.write(f"{name}\t{_code_path()}\n")
    if _armed().get(name) == _hits[name]:
        os.kill(os.getpid(), signal.SIGKILL)
    if late and _late is None:
        try:
            with open(late) as handle:
                _late = _parse(handle.read())
        except FileNotFoundError:
            return
    if _late is not None:
        _late_hits[name] += 1
        if _late.get(name) == _late_hits[name]:
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
