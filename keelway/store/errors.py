"""The store's errors: what a caller may catch, whatever backend it holds.

Every failure of a store method is one of these kinds; a driver's own error (sqlite3's
IntegrityError, OperationalError, ...) never escapes a method: the backend translates it
where it meets it, saying what was being written and why it failed, and chains the
driver's error as the cause.
"""

from __future__ import annotations

from pathlib import Path


class StoreError(Exception):
    """The store could not do what was asked."""


class NotFound(StoreError):
    """A record asked for, or one a write names (an app, an instance, a generation, an
    operation), does not exist."""


class Conflict(StoreError):
    """A compare-and-swap lost, or a unique name is taken: someone else wrote first."""


class StaleSchedule(Conflict):
    """The instance's schedule revision moved past the caller's: a newer intent owns it."""


class IllegalTransition(StoreError):
    """A bug: code tried to move a record to a state its lifecycle forbids."""


class StaleOwner(StoreError):
    """The write's owner token no longer holds the store's lease: another writer took
    it, so this one writes nothing (SPEC §8: one writer per store)."""

    def __init__(self, owner: str, holder: str | None) -> None:
        super().__init__(f"the store's lease is held by {holder!r}, not {owner!r}:"
                         " this writer is stale and writes nothing")
        self.owner = owner
        self.holder = holder


class DiskFull(StoreError):
    """A write met a full disk and was rolled back whole; retry once there is room."""

    def __init__(self, what: str, path: Path) -> None:
        super().__init__(f"{what} {path}: the disk is full")
        self.filename = str(path)  # as an OSError names it, for durable.disk_full_message
