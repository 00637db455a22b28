"""An instance's own database, laid down empty (keelway/data/instance_db.py)."""

from __future__ import annotations

from pathlib import Path

from keelway.data.instance_db import is_empty_wal, lay_down_db


def test_an_instance_database_is_laid_down_empty_in_wal_mode_once(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    assert lay_down_db(db) is True
    assert (db.stat().st_mode & 0o777) == 0o600
    assert is_empty_wal(db)
    db.write_bytes(db.read_bytes())  # the app's database: a repeat never touches it
    mtime = db.stat().st_mtime_ns
    assert lay_down_db(db) is False
    assert db.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")) == []
