"""Log files hold whatever an app prints: created 0600, rotated copies too."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from keelway.runtime.logs import open_for_append, rotate_if_large


def test_a_log_and_its_rotated_copy_are_created_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    path = tmp_path / "logs" / "apps" / "a.test" / "web.1.log"
    old_umask = os.umask(0o022)
    try:
        fd = open_for_append(path)
        os.write(fd, b"SECRET=printed by a careless app\n" * 10)
        os.close(fd)
        assert rotate_if_large(path, max_bytes=100)
    finally:
        os.umask(old_umask)
    for each in (path.parent, path, path.with_name(path.name + ".1")):
        assert stat.S_IMODE(each.stat().st_mode) & 0o077 == 0, each
    assert path.with_name(path.name + ".1").read_bytes().count(b"SECRET") == 10
