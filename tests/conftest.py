"""Shared fixtures: a fresh store in tmp_path, a home, and a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.home import Home
from keelway.store import Store
from keelway.testing.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Store:
    s = Store(tmp_path / "keelway.db", clock)
    yield s
    s.close()


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.ensure()
    return h
