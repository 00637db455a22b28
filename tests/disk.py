"""A small real filesystem that tests can fill up: a tmpfs mounted for one test.

Mounting needs root (or CAP_SYS_ADMIN); where the box refuses, the test is skipped with
the reason. The mount is always undone in teardown, lazily if something still holds it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

_CHUNKS = (1024 * 1024, 4096, 1)


def mounted_tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of `size_bytes` at `where` (created) for the caller's `with`/yield."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; this test runs as a regular user")
    where.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(where)],
        capture_output=True, text=True, check=False)
    if mount.returncode != 0:
        pytest.skip(f"this box does not allow mounting a tmpfs: {mount.stderr.strip()}")
    try:
        yield where
    finally:
        done = subprocess.run(["umount", str(where)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Write a filler file in `directory` until the filesystem has no byte left."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in _CHUNKS:
            block = b"\0" * chunk
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return filler
