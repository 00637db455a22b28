"""The store's identity numbers: the n of each tenant uid and app group (keelway/identity.py).

A number is allocated once per (space, name), in the write that first asks for it, and
never given to another name: an instance removed with its data kept, then added again,
gets its own uid back, and no other instance ever gets it. Rows are never deleted.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterable

from keelway.store.base import StoreBase


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


class Identities(StoreBase):
    def identity_number(self, space: IdSpace, name: str) -> int:
        """The number of `name` in `space`. Apps and instances are written with theirs;
        a name a store from before identities holds gets its number at this first ask."""
        row = self._one("SELECT n FROM identities WHERE space=? AND name=?", space.value, name)
        if row is not None:
            return int(row["n"])
        with self.tx() as c:
            allocate(c, space, [name])
            row = self._one("SELECT n FROM identities WHERE space=? AND name=?",
                            space.value, name)
        assert row is not None
        return int(row["n"])
