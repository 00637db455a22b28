"""The store's files: private from creation, and a full disk fails one write whole."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.store import SqliteStore
from keelway.store.errors import DiskFull
from keelway.testing.dump import dump
from tests.disk import fill, mounted_tmpfs


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "disk", 4 * 1024 * 1024)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_store_and_its_wal_and_shm_are_created_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    old_umask = os.umask(0o022)
    try:
        store = SqliteStore(tmp_path / "keelway.db")
        store.apps.ensure_app("blog")
    finally:
        os.umask(old_umask)
    try:
        for name in ("keelway.db", "keelway.db-wal", "keelway.db-shm"):
            assert mode(tmp_path / name) == 0o600, name
    finally:
        store.close()


def test_a_store_an_older_keelway_left_readable_by_others_is_narrowed_when_opened(
    tmp_path: Path,
) -> None:
    SqliteStore(tmp_path / "keelway.db").close()
    os.chmod(tmp_path / "keelway.db", 0o644)
    store = SqliteStore(tmp_path / "keelway.db")
    try:
        assert mode(tmp_path / "keelway.db") == 0o600
    finally:
        store.close()


def _write_big(store: SqliteStore, key: str) -> None:
    with store.db.tx("a test write") as conn:
        conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (key, "v" * 1_000_000))


def _keys(store: SqliteStore) -> set[str]:
    return {row["key"] for row in store.db.rows("SELECT key FROM meta")}


def test_a_write_that_meets_a_full_disk_is_rolled_back_whole_and_works_once_there_is_room(
    small_disk: Path,
) -> None:
    store = SqliteStore(small_disk / "keelway.db")
    try:
        store.apps.ensure_app("blog")
        before = (dump(store), _keys(store))
        filler = fill(small_disk)
        with pytest.raises(DiskFull, match="the disk is full"):
            _write_big(store, "big")
        assert (dump(store), _keys(store)) == before
        filler.unlink()
        _write_big(store, "big")  # the same connection, nothing reopened
        store.apps.ensure_app("news")
        assert "big" in _keys(store)
        assert [a.name for a in store.apps.list_apps()] == ["blog", "news"]
    finally:
        store.close()


def test_a_statement_that_sqlite_rolls_back_itself_on_a_full_disk_raises_disk_full(
    tmp_path: Path,
) -> None:
    """SQLite ends the transaction itself when a statement meets SQLITE_FULL; a second
    ROLLBACK must not replace that error with "no transaction is active"."""
    store = SqliteStore(tmp_path / "keelway.db")
    try:
        store.apps.ensure_app("blog")
        pages = store.db.row("PRAGMA page_count")[0]
        store.db._conn.execute(f"PRAGMA max_page_count = {pages + 1}")  # SQLite's own limit
        with pytest.raises(DiskFull, match="the disk is full"):
            _write_big(store, "big")
        store.db._conn.execute("PRAGMA max_page_count = 1073741823")
        _write_big(store, "big")
        assert "big" in _keys(store)
    finally:
        store.close()


def test_opening_a_store_on_a_full_disk_says_the_disk_is_full(small_disk: Path) -> None:
    filler = fill(small_disk)
    with pytest.raises(DiskFull, match=r"open the store .*: the disk is full"):
        SqliteStore(small_disk / "keelway.db")
    filler.unlink()
    SqliteStore(small_disk / "keelway.db").close()
