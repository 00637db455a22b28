"""A full disk: every command says so, no record changes half-way, and everything works
again by itself once there is room. The home is a small tmpfs, really filled."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.deploy.passes import PERIODIC_S
from keelway.runtime import process
from tests.disk import fill, mounted_tmpfs
from tests.e2e.harness import EXAMPLE, Keelway, free_port, wait_until

pytestmark = pytest.mark.slow

DISK_BYTES = 24 * 1024 * 1024


@pytest.fixture
def full_disk_kw(tmp_path: Path) -> Iterator[Keelway]:
    """A real daemon whose home is the whole of a small tmpfs; torn down, then unmounted."""
    for disk in mounted_tmpfs(tmp_path / "disk", DISK_BYTES):
        keelway = Keelway(home=disk / "kh", http_port=free_port())
        try:
            yield keelway
        finally:
            keelway.teardown()


def says_disk_full(kw: Keelway, *args: str) -> None:
    result = kw.run(*args, "--json")
    assert result.code != 0, f"keelway {' '.join(args)} succeeded on a full disk"
    error = result.json()["error"]
    assert error["code"] == "disk-full", error
    assert error["message"].startswith("the disk is full"), error
    assert "free space" in error["hint"]


def fill_to_the_last_byte(log: Path) -> None:
    """Also fill the last page of `log`, so not even its next line fits."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"#")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_full_disk_fails_each_command_clearly_changes_nothing_and_recovers_by_itself(
    full_disk_kw: Keelway,
) -> None:
    kw = full_disk_kw
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    before = kw.store_dump()
    releases = kw.ok("releases", "hello", "--json").out

    filler = fill(kw.home.parent)
    for command in (("config", "hello", "set", "GREETING=full"), ("restart", "hello"),
                    ("deploy", "hello", str(EXAMPLE)), ("stop", "hello")):
        says_disk_full(kw, *command)
        assert kw.store_dump() == before, command
    assert kw.ok("releases", "hello", "--json").out == releases
    assert kw.get("one.test", "/health")[0] == 200  # traffic flows on meanwhile
    for pid, ticks in kw.app_pids():  # a crash now cannot even be recorded
        process.signal_session(pid, ticks, signal.SIGKILL)
    time.sleep(PERIODIC_S + 1)  # the periodic pass meets the full disk at least once

    filler.unlink()  # no manual step after this: the crashed app comes back by itself,
    assert wait_until(lambda: kw.get("one.test", "/health")[0] == 200, timeout_s=30)
    kw.ok("config", "hello", "set", "GREETING=roomy")  # and the same commands simply work
    kw.ok("restart", "hello")
    kw.ok("deploy", "hello", str(EXAMPLE))
    assert wait_until(lambda: kw.get("one.test")[0] == 200, timeout_s=20)
    assert "roomy" in str(kw.store_dump()["releases"])

    kw.ok("down")
    kw.daemon_pid = None
    filler = fill(kw.home.parent)
    fill_to_the_last_byte(kw.home / "logs" / "keelway.log")
    result = kw.run("up", "-d", "--http", f"127.0.0.1:{kw.http_port}", "--json")
    assert result.code != 0
    assert result.json()["error"]["code"] == "disk-full", result.out
    assert result.json()["error"]["message"].startswith("the disk is full"), result.out

    filler.unlink()
    kw.up()
    assert wait_until(lambda: kw.get("one.test")[0] == 200, timeout_s=20)
