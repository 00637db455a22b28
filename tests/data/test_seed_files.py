"""A seed's files, each effect run twice (a step run again after a crash): verification,
the stored copy, the lay-down with its marker, the env names, the removal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from keelway.data import seed as files
from keelway.runtime.environment import INSTANCE_KEY, read_env_file, write_env_file

SEED = "seed-0123456789abcdef"


def _db(path: Path, rows: int = 50) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(f"row {i}" * 20,) for i in range(rows)])
    conn.commit()
    conn.close()
    return path


def test_verify_refuses_a_damaged_file_and_what_is_not_sqlite(tmp_path: Path) -> None:
    good = _db(tmp_path / "good.db", 300)
    assert files.verify_sqlite(good).size_bytes == good.stat().st_size
    bad = tmp_path / "bad.db"
    data = bytearray(good.read_bytes())
    data[4096:8192] = b"\x5a" * 4096
    bad.write_bytes(bytes(data))
    text = tmp_path / "text.db"
    text.write_text("hello")
    for path in (bad, text, tmp_path / "missing.db"):
        with pytest.raises(files.SeedRefused):
            files.verify_sqlite(path)


def test_a_stored_copy_is_consistent_and_verified_where_it_lands(tmp_path: Path) -> None:
    source = _db(tmp_path / "src.db")
    conn = sqlite3.connect(source)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("INSERT INTO t VALUES ('in the wal')")
    conn.commit()  # left open: the row is in the -wal only
    dest = tmp_path / "objects" / "seeds" / f"{SEED}.db"
    first = files.store_copy(source, dest)
    assert files.store_copy(source, dest) == first
    conn.close()
    check = sqlite3.connect(dest)
    assert check.execute("SELECT count(*) FROM t WHERE v='in the wal'").fetchone() == (1,)
    check.close()
    assert dest.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]


def test_lay_down_twice_gives_one_database_and_its_marker(tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    verified = files.store_copy(_db(tmp_path / "src.db"), copy)
    db = tmp_path / "data" / "seed" / "db.sqlite3"
    for _ in range(2):
        files.lay_down(copy, db, SEED, verified.sha256)
        assert files.local_seed_id(db) == SEED
        assert files.verify_sqlite(db).sha256 == verified.sha256
    with pytest.raises(files.SeedRefused):
        files.lay_down(copy, db, SEED, "0" * 64)


def test_remove_local_twice_takes_the_database_side_files_and_marker(tmp_path: Path) -> None:
    db = tmp_path / "seed" / "db.sqlite3"
    db.parent.mkdir()
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), files.marker_of(db)):
        path.write_text("x")
    assert files.remove_local(db) == ["db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm",
                                      "db.sqlite3.seed"]
    assert files.remove_local(db) == [] and not db.parent.exists()


def test_the_import_s_env_names_are_retired_against_env_before(tmp_path: Path) -> None:
    env = tmp_path / "a.env"
    write_env_file(env, {INSTANCE_KEY: "original", "OTHER": "kept"})
    before = files.env_before(env)
    db = tmp_path / "seed" / "db.sqlite3"
    assert files.write_import_env(env, db, before)
    minted = read_env_file(env)[INSTANCE_KEY]
    assert minted != "original"
    assert not files.write_import_env(env, db, before)  # run again: the same key
    assert read_env_file(env)[INSTANCE_KEY] == minted
    write_env_file(env, read_env_file(env) | {"LATER": "added since"})
    assert files.retire_import_env(env, before)
    assert not files.retire_import_env(env, before)
    assert read_env_file(env) == {INSTANCE_KEY: "original", "OTHER": "kept",
                                  "LATER": "added since"}


def test_a_key_the_env_file_lacked_before_the_import_goes(tmp_path: Path) -> None:
    env = tmp_path / "a.env"
    before = files.env_before(env)
    files.write_import_env(env, tmp_path / "db", before)
    files.retire_import_env(env, before)
    assert read_env_file(env) == {}


def test_inspect_counts_the_rows_of_tables_with_awkward_names_and_reads_no_wal_it_lacks(
        tmp_path: Path) -> None:
    path = tmp_path / "seed.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript('CREATE TABLE "we""ird" (v); INSERT INTO "we""ird" VALUES (1), (2);'
                       'CREATE TABLE "select" (v); CREATE VIEW "v w" AS SELECT * FROM '
                       '"we""ird";')
    conn.close()
    found = files.inspect(path)
    assert found.tables == (('we"ird', 2), ("select", 0)) and found.wal is False
    assert found.need_bytes == found.apparent_bytes == path.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed.sqlite3"]  # nothing beside
