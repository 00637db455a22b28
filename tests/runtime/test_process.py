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


@pytest.mark.parametrize("start", ["vfork", "close_range", "walk"])
def test_a_child_holds_only_stdio_and_what_it_is_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """A vfork-style start closes all but stdio and `pass_fds` in the child. uvloop's
    fork, the fallback, passes on every inheritable descriptor whatever `close_fds`
    says: the child marks them close-on-exec itself, with close_range(2) or, on a kernel
    without it, by walking /proc/self/fd. Each leaves exactly stdio and `pass_fds`."""
    if start != "vfork":
        monkeypatch.setattr(process, "_vfork_start", False)
    if start == "walk":
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


def test_a_vfork_started_child_is_reaped_by_its_pidfd_with_its_status(tmp_path: Path) -> None:
    """Not the loop's child: its exit comes from a pidfd, its status by our waitpid,
    negative for a signal as asyncio says it; the pidfd is closed once it is reaped."""
    async def scenario() -> tuple[int, int, int]:
        ok = await _spawn("raise SystemExit(3)", tmp_path)
        killed = await _spawn("import time; time.sleep(60)", tmp_path)
        assert isinstance(ok.proc, process.Child) and isinstance(killed.proc, process.Child)
        os.kill(killed.pid, signal.SIGKILL)
        fds_before = len(os.listdir("/proc/self/fd"))
        codes = await ok.proc.wait(), await killed.proc.wait()
        assert killed.proc.returncode == -signal.SIGKILL
        return *codes, fds_before - len(os.listdir("/proc/self/fd"))

    assert uvloop.run(scenario()) == (3, -signal.SIGKILL, 2)


def test_a_vfork_start_runs_the_command_with_the_environment_it_is_given(
        tmp_path: Path) -> None:
    """The stub's shell adds PWD, as the app's own `sh -c` does, and nothing else."""
    code = "import os, sys; print(sorted(os.environ), os.getcwd(), sys.argv[1:])"
    env = {"KEEP": "this one", "PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8"}

    async def scenario() -> int:
        spawned = await process.spawn([sys.executable, "-S", "-c", code, "a b", "--", "$x"],
                                      cwd=tmp_path, env=env, log_path=tmp_path / "out.log")
        return await spawned.proc.wait()

    assert uvloop.run(scenario()) == 0
    assert (tmp_path / "out.log").read_text().strip() == (
        f"{sorted([*env, 'PWD'])} {tmp_path} ['a b', '--', '$x']")
