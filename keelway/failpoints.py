"""Named failpoints: places where a test may kill the control plane outright.

`KEELWAY_FAILPOINTS=name[,name...]` arms them. An armed failpoint SIGKILLs this process:
it never raises, because an exception would run `finally` blocks and cleanup that a
real crash would not, and the tests would then prove the wrong thing.

Every durable write and every external effect has one failpoint before it and one
after it; `KNOWN` lists them all so that the crash matrix can say what it covered.
"""

from __future__ import annotations

import os
import signal

KNOWN: set[str] = set()


def _armed() -> frozenset[str]:
    raw = os.environ.get("KEELWAY_FAILPOINTS", "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def declare(*names: str) -> None:
    KNOWN.update(names)


def hit(name: str) -> None:
    """Die here, now, if `name` is armed."""
    if name in _armed():
        os.kill(os.getpid(), signal.SIGKILL)
