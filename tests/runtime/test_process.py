from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import uvloop

from keelway.clock import SystemClock
from keelway.runtime import process

IGNORES_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


async def _spawn(code: str, tmp_path: Path) -> process.Spawned:
    return await process.spawn([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ),
                               log_path=tmp_path / "out.log")


def test_a_spawned_process_leads_its_own_session_and_logs_to_its_file(tmp_path: Path) -> None:
    async def scenario() -> None:
        spawned = await _spawn("print('hello', flush=True)", tmp_path)
        stat = process.read_stat(spawned.pid)
        assert stat is not None and stat.session == spawned.pid
        assert await spawned.proc.wait() == 0

    asyncio.run(scenario())
    assert (tmp_path / "out.log").read_text() == "hello\n"


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    async def scenario() -> float:
        spawned = await _spawn(IGNORES_TERM, tmp_path)
        await asyncio.sleep(0.3)
        started = time.monotonic()
        gone = await process.stop(spawned.pid, spawned.start_ticks, grace_s=0.5,
                                  clock=SystemClock(), proc=spawned.proc)
        assert gone
        assert not process.is_alive(spawned.pid, spawned.start_ticks)
        assert spawned.proc.returncode == -signal.SIGKILL
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert 0.4 < elapsed < 5


def test_stop_kills_the_children_the_app_forked(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(p.pid, flush=True); time.sleep(60)"
    )

    async def scenario() -> int:
        spawned = await _spawn(code, tmp_path)
        for _ in range(100):
            if (tmp_path / "out.log").read_text().strip():
                break
            await asyncio.sleep(0.05)
        child = int((tmp_path / "out.log").read_text().strip())
        assert len(process.session_members(spawned.pid, spawned.start_ticks)) == 2
        assert await process.stop(spawned.pid, spawned.start_ticks, grace_s=2,
                                  clock=SystemClock(), proc=spawned.proc)
        return child

    child = asyncio.run(scenario())
    stat = process.read_stat(child)
    assert stat is None or stat.state == "Z"


def test_a_reused_pid_is_not_mistaken_for_the_process(tmp_path: Path) -> None:
    stat = process.read_stat(os.getpid())
    assert stat is not None
    assert process.is_alive(os.getpid(), stat.start_ticks)
    assert not process.is_alive(os.getpid(), stat.start_ticks + 1)


def test_stopping_a_process_that_is_already_gone_is_proven_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        spawned = await _spawn("pass", tmp_path)
        await spawned.proc.wait()
        assert await process.stop(spawned.pid, spawned.start_ticks, grace_s=5,
                                   clock=SystemClock(), proc=spawned.proc)

    asyncio.run(scenario())


LIST_FDS = ("import os; print(sorted(int(n) for n in os.listdir('/proc/self/fd')"
            " if os.path.exists(f'/proc/self/fd/{n}')), flush=True)")


@pytest.mark.parametrize("close_range", [True, False], ids=["close_range", "walk"])
def test_a_child_holds_only_stdio_and_what_it_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, close_range: bool) -> None:
    """uvloop passes on every inheritable descriptor whatever `close_fds` says: the child
    marks them close-on-exec itself, with close_range(2) or, on a kernel without it, by
    walking /proc/self/fd; both leave exactly stdio and `pass_fds`."""
    if not close_range:
        monkeypatch.setattr(process, "_syscall", None)
    leaked_r, leaked_w = os.pipe()
    given_r, given_w = os.pipe()
    for fd in (leaked_r, leaked_w, given_r, given_w):
        os.set_inheritable(fd, True)  # as a descriptor received without CLOEXEC would be

    async def scenario() -> None:
        spawned = await process.spawn([sys.executable, "-S", "-c", LIST_FDS], cwd=tmp_path,
                                      env=dict(os.environ), log_path=tmp_path / "out.log",
                                      pass_fds=(given_w,))
        assert await spawned.proc.wait() == 0

    try:
        uvloop.run(scenario())
    finally:
        for fd in (leaked_r, leaked_w, given_r, given_w):
            os.close(fd)
    assert (tmp_path / "out.log").read_text().strip() == str([0, 1, 2, given_w])
