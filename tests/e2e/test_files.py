"""Files under a used home: nothing is readable by group or other, and local secrets of
the app's directory never reach its build."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.e2e.harness import EXAMPLE, Keelway

pytestmark = pytest.mark.slow


def readable_by_others(home: Path) -> list[str]:
    """Every path under `home` (itself included) with any group or other bit set.

    Symlinks are skipped: their own mode is always 0777 and never checked by the kernel.
    """
    wide = []
    for path in [home, *home.rglob("*")]:
        info = path.lstat()
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
            wide.append(f"{oct(stat.S_IMODE(info.st_mode))} {path.relative_to(home)}")
    return wide


def test_nothing_under_a_used_home_is_readable_by_group_or_other(
    kw: Keelway, tmp_path: Path
) -> None:
    app = tmp_path / "hello"
    shutil.copytree(EXAMPLE, app)
    (app / ".env").write_text("STRIPE_KEY=sk_live_local\n")
    (app / "node_modules" / "dep").mkdir(parents=True)
    (app / "node_modules" / "dep" / "index.js").write_text("module.exports = 1\n")
    old_umask = os.umask(0o022)  # an operator's usual shell: keelway must not depend on it
    try:
        kw.up()
        kw.ok("deploy", "hello", str(app), "--host", "one.test", "--host", "two.test")
        assert kw.get("one.test")[0] == 200  # the app writes its database
        kw.ok("config", "hello", "set", "GREETING=hi")
        kw.ok("restart", "hello", "--instance", "two.test")
        kw.ok("logs", "hello")
        kw.ok("router", "restart")
        kw.ok("gc")
    finally:
        os.umask(old_umask)
    assert (kw.home / "keelway.db-wal").exists()
    assert (kw.home / "data" / "one.test" / "db.sqlite3").exists()
    assert (kw.home / "env" / "one.test.env").exists()
    assert (kw.home / "router" / "routes.json").exists()
    assert readable_by_others(kw.home) == []
    build = (kw.home / "current" / "one.test").resolve()
    assert (build / "web.py").is_file()
    assert not (build / ".env").exists() and not (build / "node_modules").exists()
