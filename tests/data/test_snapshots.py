"""Snapshots and their verification, on real SQLite files and a local object store."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway import names
from keelway.data import snapshots
from keelway.data.objects import LocalObjects, ObjectNotFound
from keelway.data.verify import Damaged, verify_file
from keelway.home import Home
from tests.disk import fill, mounted_tmpfs

HOST = "a.test"


def _db(home: Home, rows: int = 200) -> Path:
    path = home.db_path(HOST)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA user_version=7")
    conn.execute("CREATE TABLE t (n INTEGER, s TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 100) for i in range(rows)])
    conn.close()
    return path


def _rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM t").fetchone()[0])
    finally:
        conn.close()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_snapshot_is_stored_verified_with_its_manifest(tmp_path: Path) -> None:
    home = Home(tmp_path)
    _db(home)
    objects = LocalObjects(home.objects_dir)
    made = snapshots.take(objects, home, HOST, now_s=1_800_000_000.5, release=3)
    assert names.SNAPSHOT_ID.accepts(made.id) and made.id.startswith("20270115T080000500000Z")
    assert (made.instance, made.release, made.schema_version) == (HOST, 3, 7)
    assert [m.id for m in snapshots.list_snapshots(objects, HOST)] == [made.id]
    out = tmp_path / "restored.db"
    assert snapshots.fetch(objects, HOST, made.id, out) == made
    assert _rows(out) == 200
    assert [p.name for p in home.data_dir(HOST).iterdir() if p.name.startswith(".tmp-")] == []


def test_snapshot_ids_sort_by_the_time_they_were_taken() -> None:
    ids = [names.snapshot_id(t, "0000") for t in (1.0, 10.0, 1e9, 1.8e9)]
    assert ids == sorted(ids)


def test_a_snapshot_with_a_flipped_byte_is_refused(tmp_path: Path) -> None:
    home = Home(tmp_path)
    _db(home)
    objects = LocalObjects(home.objects_dir)
    made = snapshots.take(objects, home, HOST, now_s=1.0, release=None)
    stored = home.objects_dir / f"instances/{HOST}/snapshots/{made.id}.db"
    raw = bytearray(stored.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    stored.write_bytes(bytes(raw))
    with pytest.raises(Damaged, match="sha256"):
        snapshots.fetch(objects, HOST, made.id, tmp_path / "out.db")
    assert not (tmp_path / "out.db").exists()


def test_a_file_with_damaged_pages_fails_integrity_check(tmp_path: Path) -> None:
    path = _db(Home(tmp_path), rows=3000)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    raw = bytearray(path.read_bytes())
    for offset in range(4096 * 3, 4096 * 3 + 600):  # inside a b-tree page, not the header
        raw[offset] ^= 0x5A
    path.write_bytes(bytes(raw))
    with pytest.raises(Damaged):
        verify_file(path)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(Damaged):
        verify_file(path)


def test_an_unknown_snapshot_is_not_found(tmp_path: Path) -> None:
    objects = LocalObjects(tmp_path / "objects")
    with pytest.raises(ObjectNotFound):
        snapshots.fetch(objects, HOST, "20260101T000000000000Z-0000", tmp_path / "x.db")


def test_prune_keeps_the_newest_and_sweeps_copies_without_a_manifest(tmp_path: Path) -> None:
    home = Home(tmp_path)
    _db(home, rows=5)
    objects = LocalObjects(home.objects_dir)
    made = [snapshots.take(objects, home, HOST, now_s=float(t), release=None)
            for t in range(1, 5)]
    orphan = f"instances/{HOST}/snapshots/{names.snapshot_id(99.0, 'ffff')}.db"
    objects.put_file(orphan, home.db_path(HOST))
    assert snapshots.prune(objects, HOST, keep=2) == [made[0].id, made[1].id]
    assert [m.id for m in snapshots.list_snapshots(objects, HOST)] == [m.id for m in made[2:]]
    assert not objects.exists(orphan)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "disk", 8 * 1024 * 1024)


@pytest.mark.slow
def test_a_full_disk_during_a_snapshot_leaves_the_database_and_the_store_as_they_were(
        small_disk: Path) -> None:
    home = Home(small_disk / "home")
    _db(home, rows=20_000)  # ~2.5 MB
    objects = LocalObjects(home.objects_dir)
    first = snapshots.take(objects, home, HOST, now_s=1.0, release=None)
    db_before = _tree(home.data_dir(HOST))
    store_before = _tree(home.objects_dir)
    filler = fill(small_disk)
    with pytest.raises((OSError, sqlite3.Error)):
        snapshots.take(objects, home, HOST, now_s=2.0, release=None)
    filler.unlink()
    assert _tree(home.data_dir(HOST)) == db_before
    assert _tree(home.objects_dir) == store_before
    assert [m.id for m in snapshots.list_snapshots(objects, HOST)] == [first.id]
    assert _rows(home.db_path(HOST)) == 20_000
