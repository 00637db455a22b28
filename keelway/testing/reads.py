"""Reads for tests of `Store.read_aside` (keelway/store/aside.py): module-level, so the
reading process can import them by name as it would a view's."""

from __future__ import annotations

import os

from keelway.store import Store


def pid_and_apps(store: Store) -> tuple[int, list[str]]:
    """Which process read, and the apps it saw."""
    return os.getpid(), [a.name for a in store.apps.list_apps()]


def writes(store: Store) -> None:
    """A write, which a read-only reader refuses."""
    store.apps.ensure_app("nope")
