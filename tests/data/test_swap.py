"""The database swap of a restore, from every state a crash can leave it in."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from keelway.data import kept, swap


def _kept(db: Path) -> list[int]:
    """The rows of every database kept beside `db`, oldest first."""
    return [_rows(c.path / "db.sqlite3") for c in kept.databases(db)]


def _db(path: Path, rows: int, *, keep_wal: bool = False) -> sqlite3.Connection | None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(rows)])
    if keep_wal:
        return conn  # rows still only in the -wal while this connection lives
    conn.close()
    return None


def _rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return int(conn.execute("SELECT COUNT(*) FROM t").fetchone()[0])
    finally:
        conn.close()


def _copy_db(src: Path, dest: Path) -> None:
    """A copy of `src` with its -wal, as a SIGKILLed app leaves them."""
    dest.write_bytes(src.read_bytes())
    wal = Path(f"{src}-wal")
    if wal.exists():
        Path(f"{dest}-wal").write_bytes(wal.read_bytes())


@pytest.fixture()
def laid(tmp_path: Path) -> tuple[Path, Path]:
    """An old database whose last rows live only in its -wal, and a staged copy."""
    live = tmp_path / "live.db"
    conn = _db(live, 5, keep_wal=True)
    data = tmp_path / "data" / "one.test"
    data.mkdir(parents=True)
    db = data / "db.sqlite3"
    _copy_db(live, db)
    assert conn is not None
    conn.close()
    staged = swap.staged_path(db, "20260101T000000000000Z-0000")
    _db(staged, 3)
    swap.to_wal(staged)
    assert Path(f"{db}-wal").stat().st_size > 0
    return db, staged


def test_a_staged_copy_no_swap_committed_to_is_removed_and_the_old_database_kept(
        laid: tuple[Path, Path]) -> None:
    db, staged = laid
    assert swap.finish_all(db.parent.parent) == []
    assert not staged.exists()
    assert _rows(db) == 5


def test_a_committed_swap_rolls_forward_from_each_state_a_crash_leaves(
        laid: tuple[Path, Path]) -> None:
    db, staged = laid
    swap.commit(db, staged)
    # crashed mid-way through moving the old files aside: the -wal moved, the db not
    aside = db.parent / swap.ASIDE
    aside.mkdir()
    os.replace(f"{db}-wal", aside / f"{db.name}-wal")
    assert swap.finish_all(db.parent.parent) == ["one.test"]
    assert _rows(db) == 3
    assert sorted(p.name for p in db.parent.iterdir()) == ["db.sqlite3", kept.KEPT]
    # The replaced database, with the rows only its -wal held, is kept whole.
    assert _kept(db) == [5]
    assert swap.finish_all(db.parent.parent) == []  # idempotent


def test_a_swap_whose_new_file_is_in_place_only_drops_the_old_files(
        laid: tuple[Path, Path]) -> None:
    db, staged = laid
    aside = db.parent / swap.ASIDE
    aside.mkdir()
    for side in swap.SIDES:
        if Path(f"{db}{side}").exists():
            os.replace(f"{db}{side}", aside / f"{db.name}{side}")
    os.replace(staged, db)
    assert swap.finish(db) is True
    assert _rows(db) == 3 and not aside.exists()
    assert _kept(db) == [5]


def test_a_whole_swap_replaces_the_database_and_its_sides(laid: tuple[Path, Path]) -> None:
    db, staged = laid
    litestream = swap.litestream_state(db)
    litestream.mkdir()
    (litestream / "positions").write_bytes(b"of the old file")
    swap.swap(db, staged)
    assert _rows(db) == 3
    assert not Path(f"{db}-wal").exists() or _rows(db) == 3
    assert not (db.parent / swap.ASIDE).exists() and not swap.incoming(db).exists()
    # The new file does not inherit the old one's replica positions, anywhere.
    assert not litestream.exists()
    [copy] = kept.databases(db)
    assert sorted(p.name for p in copy.path.iterdir()) == ["db.sqlite3", "db.sqlite3-wal"]
    assert _rows(copy.path / "db.sqlite3") == 5


def test_the_next_swap_keeps_the_database_it_replaced_beside_the_one_kept_before(
        laid: tuple[Path, Path]) -> None:
    db, staged = laid
    swap.swap(db, staged)
    again = swap.staged_path(db, "20260101T000000000001Z-0001")
    _db(again, 7)
    swap.swap(db, again)
    assert _rows(db) == 7
    # Neither replaced database is the only copy of anything lost: both stay.
    assert sorted(_kept(db)) == [3, 5]
    assert len({c.id for c in kept.databases(db)}) == 2


@pytest.mark.parametrize("point", ["restore.swap.aside", "restore.swap.placed",
                                   "restore.swap.kept"])
def test_a_crash_at_any_point_of_the_swap_is_finished_at_boot(
        laid: tuple[Path, Path], point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db, staged = laid
    swap.swap(db, staged)  # a previous restore's copy kept: 5 rows
    again = swap.staged_path(db, "20260101T000000000001Z-0001")
    _db(again, 7)
    swap.to_wal(again)

    class Crash(Exception):
        pass

    def hit(name: str) -> None:
        if name == point:
            raise Crash(name)

    monkeypatch.setattr(swap.failpoints, "hit", hit)
    with pytest.raises(Crash):
        swap.swap(db, again)
    monkeypatch.undo()
    swap.finish_all(db.parent.parent)
    assert _rows(db) == 7
    assert sorted(_kept(db)) == [3, 5]
    assert sorted(p.name for p in db.parent.iterdir()) == ["db.sqlite3", kept.KEPT]
    assert not [p for p in kept.kept_dir(db).iterdir() if p.name.startswith(".tmp")]


def test_a_swap_over_no_database_leaves_the_kept_one(tmp_path: Path) -> None:
    data = tmp_path / "data" / "one.test"
    data.mkdir(parents=True)
    db = data / "db.sqlite3"
    legacy = db.parent / kept.LEGACY_DB  # what an older keelway kept
    legacy.mkdir()
    _db(legacy / "db.sqlite3", 2)
    staged = swap.staged_path(db, "x")
    _db(staged, 4)
    swap.swap(db, staged)
    assert _rows(db) == 4 and _kept(db) == [2]
    assert [c.id for c in kept.databases(db)] == [kept.LEGACY_DB]


def test_a_forgotten_copy_is_gone_and_a_crash_mid_forget_leaves_nothing_listed(
        laid: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    db, staged = laid
    swap.swap(db, staged)
    again = swap.staged_path(db, "y")
    _db(again, 7)
    swap.swap(db, again)
    first, second = kept.databases(db)

    class Crash(Exception):
        pass

    def hit(name: str) -> None:
        if name == "kept.forget.after":
            raise Crash(name)

    monkeypatch.setattr(kept.failpoints, "hit", hit)
    with pytest.raises(Crash):
        kept.forget(first)
    monkeypatch.undo()
    assert kept.databases(db) == [second]  # the renamed one is listed nowhere
    swap.finish_all(db.parent.parent)  # and boot deletes it
    assert sorted(p.name for p in kept.kept_dir(db).iterdir()) == [second.path.name]
    kept.forget(second)
    assert kept.databases(db) == []


def test_to_wal_leaves_a_wal_copy_alone_and_converts_a_rollback_one(tmp_path: Path) -> None:
    wal = tmp_path / "wal.db"
    _db(wal, 1)
    before = wal.read_bytes()
    swap.to_wal(wal)
    assert wal.read_bytes() == before
    plain = tmp_path / "plain.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE t (n INTEGER)")
    conn.commit()
    conn.close()
    swap.to_wal(plain)
    conn = sqlite3.connect(plain)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_boot_removes_what_a_crashed_snapshot_or_verify_left_and_nothing_of_the_app(
        tmp_path: Path) -> None:
    data = tmp_path / "data" / "one.test"
    data.mkdir(parents=True)
    left = [".tmp-snapshot-x.db", ".tmp-manifest-1-ab", ".tmp-verify-x.db",
            ".tmp-.tmp-restore-x.db.12", ".tmp-restore-x.db"]
    for name in [*left, "db.sqlite3", "uploads.bin", ".tmp-app-own"]:
        (data / name).write_bytes(b"x")
    assert swap.finish_all(tmp_path / "data") == []
    assert sorted(p.name for p in data.iterdir()) == [".tmp-app-own", "db.sqlite3",
                                                      "uploads.bin"]


@pytest.mark.parametrize("kind", ["file", pytest.param("s3", marks=pytest.mark.slow)])
def test_a_replica_ahead_of_a_swapped_in_older_file_restores_to_that_file(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    """What keelway/deploy/restore.py counts on where it cannot set a replica aside (S3):
    litestream 0.5.17, replicating a file swapped in by `swap.swap` (no local state of
    the old one) to a replica that holds the old file's later transactions, writes it
    on top, so the replica's latest restore is the swapped-in file, and later writes
    follow it."""
    import json
    import subprocess

    from keelway.data.replicas import litestream_binary, litestream_env, replica_config

    binary = litestream_binary()
    if binary is None:
        pytest.skip("no litestream binary")
    if kind == "s3":
        server = request.getfixturevalue("s3_env")
        url, endpoint = f"s3://{server.bucket}/swap-{os.urandom(4).hex()}", server.endpoint
    else:
        url, endpoint = (tmp_path / "replica").as_uri(), None
    data = tmp_path / "data" / "one.test"
    data.mkdir(parents=True)
    db = data / "db.sqlite3"
    config = tmp_path / "litestream.yml"
    config.write_text(json.dumps(replica_config(db, url, endpoint=endpoint)))

    def litestream(*args: str) -> None:
        subprocess.run([str(binary), args[0], "-config", str(config), *args[1:]],
                       check=True, capture_output=True, env=litestream_env(), timeout=60)

    def restored() -> int:
        out = tmp_path / f"out-{os.urandom(2).hex()}.db"
        litestream("restore", "-o", str(out), str(db))
        return _rows(out)

    _db(db, 3)
    staged = swap.staged_path(db, "older")
    staged.write_bytes(db.read_bytes())  # the "snapshot": 3 rows
    litestream("replicate", "-once")
    _db(db, 4)  # 7 rows, replicated: the replica is ahead of the snapshot
    litestream("replicate", "-once")
    assert restored() == 7
    swap.swap(db, staged)
    assert not swap.litestream_state(db).exists()
    litestream("replicate", "-once")
    assert restored() == 3
    _db(db, 2)
    litestream("replicate", "-once")
    assert restored() == 5


def test_a_replica_set_aside_is_listed_with_its_host_only_never_another_instance_s(
        tmp_path: Path) -> None:
    replicas = tmp_path / "replicas"
    own = replicas / "a.test"
    own.mkdir(parents=True)
    aside = kept.set_replica_aside(own)
    assert aside is not None and not own.exists()
    assert kept.set_replica_aside(own) is None  # a step run again moves nothing
    (replicas / "a.test.replaced").mkdir()  # an older keelway's, or host a.test.replaced's
    (replicas / "a.test.replaced-5").mkdir()  # host a.test.replaced-5's own replica
    listed = kept.replicas(own, {"a.test", "a.test.replaced-5"})
    assert {c.path.name for c in listed} == {"a.test.replaced", aside.name}
    assert [c.id for c in kept.replicas(own, {"a.test", "a.test.replaced"})] == [
        f"replica-{aside.name.rpartition('-')[2]}"]
