"""The contract suite's backends and fixtures: every test here runs once per backend.

A backend is a factory `(place, owner) -> Store` that opens a handle on the records of
one test: called again in the same test it opens the same records again (as a restarted
control plane does), by the writer `owner` (None: the box's one token). A new store adds
one entry to `BACKENDS`; nothing else in the suite names a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from keelway.store import SqliteStore, Store
from keelway.testing.clock import FakeClock
from keelway.testing.memory_store import MemoryStore, MemoryTables


@dataclass
class Place:
    """Where one test's records live: its temp dir, its clock, and the objects a
    backend keeps between its handles (`shared`)."""

    tmp_path: Path
    clock: FakeClock
    _kept: dict[str, Any] = field(default_factory=dict)

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]


class OpenStore(Protocol):
    def __call__(self, owner: str | None = None) -> Store: ...


def _sqlite(place: Place, owner: str | None) -> Store:
    return SqliteStore(place.tmp_path / "keelway.db", place.clock, owner=owner)


def _memory(place: Place, owner: str | None) -> Store:
    """The in-memory store (keelway/testing/memory_store.py): its handles in one test
    share one `MemoryTables`, as SQLite's share one file."""
    return MemoryStore(place.clock, place.shared("memory", MemoryTables), owner=owner)


BACKENDS: dict[str, Callable[[Place, str | None], Store]] = {
    "sqlite": _sqlite,
    "memory": _memory,
}


@pytest.fixture(params=sorted(BACKENDS))
def open_store(request: pytest.FixtureRequest, tmp_path: Path,
               clock: FakeClock) -> Iterator[OpenStore]:
    """Opens the same records again on each call; every handle is closed at the end."""
    place = Place(tmp_path, clock)
    opened: list[Store] = []

    def open_(owner: str | None = None) -> Store:
        opened.append(BACKENDS[request.param](place, owner))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    return open_store()
