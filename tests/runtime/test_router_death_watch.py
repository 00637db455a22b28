"""The router's death watch: a real signal of death, for our child and for a process
that is not (a router adopted after a control-plane restart), and the poll fallback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest

from keelway.runtime import process
from keelway.runtime.death_watch import DeathWatch
from keelway.runtime.router import RouterHandle


def _handle(pid: int) -> RouterHandle:
    stat = process.read_stat(pid)
    assert stat is not None
    return RouterHandle(pid, stat.start_ticks, adopted=True)


async def _seconds_to_notice(handle: RouterHandle, pidfd: bool) -> tuple[float, str]:
    died = asyncio.Event()
    watch = DeathWatch(handle, died.set, pidfd=pidfd)
    await asyncio.sleep(0.05)
    assert not died.is_set()
    start = time.monotonic()
    os.kill(handle.pid, signal.SIGKILL)
    await asyncio.wait_for(died.wait(), timeout=5)
    return time.monotonic() - start, watch.kind


@pytest.mark.parametrize("pidfd", [True, False])
def test_the_death_of_a_child_is_noticed(pidfd: bool) -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        took_s, kind = asyncio.run(_seconds_to_notice(_handle(child.pid), pidfd))
    finally:
        child.kill()
        child.wait()
    assert kind == ("pidfd" if pidfd else "poll")
    assert took_s < (0.1 if pidfd else 1.0)


def test_the_death_of_a_process_that_is_not_our_child_is_noticed_at_once() -> None:
    # `sh` starts sleep in the background and exits: sleep is reparented, not ours.
    out = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    handle = _handle(int(out))
    try:
        took_s, kind = asyncio.run(_seconds_to_notice(handle, pidfd=True))
    finally:
        if process.is_alive(handle.pid, handle.start_ticks):
            os.kill(handle.pid, signal.SIGKILL)
    assert kind == "pidfd" and took_s < 0.1


def test_a_watch_on_a_process_already_gone_fires_at_once() -> None:
    child = subprocess.Popen(["true"])
    handle = _handle(child.pid)
    child.wait()

    async def watch() -> None:
        died = asyncio.Event()
        DeathWatch(handle, died.set)
        await asyncio.wait_for(died.wait(), timeout=1)

    asyncio.run(watch())
