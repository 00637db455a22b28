"""Log files hold whatever an app prints: created 0600, rotated copies too."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.runtime.logs import open_for_append, rotate_if_large
from tests.disk import fill, mounted_tmpfs


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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "disk", 1024 * 1024)


def test_a_rotation_the_full_disk_has_no_room_for_keeps_every_copy_and_retries_later(
    small_disk: Path,
) -> None:
    path = small_disk / "web.1.log"
    path.write_bytes(b"current\n" * 20_000)
    for n, text in ((1, b"previous\n"), (2, b"older\n")):
        path.with_name(f"web.1.log.{n}").write_bytes(text)
    filler = fill(small_disk)
    assert not rotate_if_large(path, max_bytes=1000)
    assert sorted(p.name for p in small_disk.iterdir()) == [
        "filler", "web.1.log", "web.1.log.1", "web.1.log.2"]
    assert path.with_name("web.1.log.1").read_bytes() == b"previous\n"
    filler.unlink()
    assert rotate_if_large(path, max_bytes=1000)
    assert [path.with_name(f"web.1.log.{n}").read_bytes()[:8] for n in (1, 2, 3)] == [
        b"current\n", b"previous", b"older\n"]
    assert path.stat().st_size == 0
