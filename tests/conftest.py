"""Shared fixtures: a fresh store in tmp_path, a home, and a fake clock."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.home import Home
from keelway.store import SqliteStore, Store
from keelway.testing.clock import FakeClock
from tests.e2e.harness import Keelway, free_port


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Store:
    s = SqliteStore(tmp_path / "keelway.db", clock)
    yield s
    s.close()


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.ensure()
    return h


@pytest.fixture
def kw(tmp_path: Path) -> Iterator[Keelway]:
    """A real daemon driven by the real CLI in a temp KEELWAY_HOME, torn down by pid."""
    keelway = Keelway(home=tmp_path / "kh", http_port=free_port())
    yield keelway
    keelway.teardown()


@pytest.fixture
def kw_root() -> Iterator[Keelway]:
    """`kw` in a home other uids can reach (pytest's tmp_path is 0700 all the way down), so
    that where the tests run as root each instance runs as a uid of its own."""
    base = Path(tempfile.mkdtemp(prefix="kw-ids-", dir="/tmp"))
    base.chmod(0o711)
    keelway = Keelway(home=base / "kh", http_port=free_port())
    try:
        yield keelway
    finally:
        keelway.teardown()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def deps_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One dependency cache (KEELWAY_BUILD_CACHE) for every test that builds a real app
    from the package registries, so the suite installs each dependency set once."""
    # On the homes' filesystem (a build hard-links its files from the cache).
    return tmp_path_factory.mktemp("deps-cache")
