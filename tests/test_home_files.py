"""The home's modes, and the one rule that recognises a full disk."""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from keelway.builds.errors import StagingError
from keelway.durable import disk_full, disk_full_message, write_atomic
from keelway.home import Home


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_new_home_and_every_directory_in_it_are_0700_whatever_the_umask(
    tmp_path: Path,
) -> None:
    home = Home(tmp_path / "kh")
    old_umask = os.umask(0o022)
    try:
        home.ensure()
        write_atomic(home.router_dir / "x.json", b"{}")
    finally:
        os.umask(old_umask)
    dirs = [home.root, *(p for p in home.root.rglob("*") if p.is_dir())]
    assert len(dirs) > 5
    assert {str(p.relative_to(home.root)): mode(p) for p in dirs} == {
        str(p.relative_to(home.root)): 0o700 for p in dirs}
    assert mode(home.router_dir / "x.json") == 0o600


def test_a_home_an_older_keelway_laid_down_readable_by_others_is_narrowed(
    tmp_path: Path,
) -> None:
    home = Home(tmp_path / "kh")
    for sub in ("", "data", "logs"):
        (home.root / sub).mkdir(mode=0o755, exist_ok=True)
        os.chmod(home.root / sub, 0o755)
    home.ensure()
    assert mode(home.root) == mode(home.root / "data") == mode(home.root / "logs") == 0o700


def test_a_full_disk_is_recognised_from_the_os_and_from_sqlite_through_any_wrapping(
    tmp_path: Path,
) -> None:
    conn = sqlite3.connect(tmp_path / "tiny.db", isolation_level=None)
    conn.execute("CREATE TABLE t (v BLOB)")
    conn.execute("PRAGMA max_page_count = 3")  # SQLite's own SQLITE_FULL, for real
    with pytest.raises(sqlite3.OperationalError) as full_db:
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    conn.close()
    no_space = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/src/app.py", None,
                       "/home/builds/app.py")
    try:
        try:
            raise no_space
        except OSError as exc:
            raise StagingError("stage blog from /src") from exc
    except StagingError as wrapped:
        staged = wrapped
    assert disk_full(full_db.value) and disk_full(no_space) and disk_full(staged)
    assert disk_full_message(staged) == (
        "the disk is full: no space left to write /home/builds/app.py")
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(sqlite3.ProgrammingError("Cannot operate on a closed database."))
