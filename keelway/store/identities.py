"""The store's identity numbers: the n of each tenant uid and app group (keelway/identity.py).

A number is allocated once per (space, name), in the write that first asks for it, and
never given to another name: an instance removed with its data kept, then added again,
gets its own uid back, and no other instance ever gets it. Rows are never deleted.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterable


class IdSpace(enum.StrEnum):
    UID = "uid"   # names: "instance:HOST", "build:APP"
    GID = "gid"   # names: "app:APP"


def allocate(c: sqlite3.Connection, space: IdSpace, names: Iterable[str]) -> None:
    """Give each new name of `names` the next number of `space`; inside the caller's
    transaction, so an app or an instance is written with its numbers, in one write."""
    for name in names:
        c.execute(
            "INSERT INTO identities(space, name, n) SELECT ?, ?, COALESCE(MAX(n), -1) + 1"
            " FROM identities WHERE space=? ON CONFLICT(space, name) DO NOTHING",
            (space.value, name, space.value))


def app_names(app: str) -> tuple[list[str], list[str]]:
    """The uid names and gid names an app is written with: its builder, its group."""
    return [f"build:{app}"], [f"app:{app}"]


def instance_name(host: str) -> str:
    return f"instance:{host}"
