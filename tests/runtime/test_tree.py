"""A generation is its whole process tree (SPEC §6): real processes that double-fork and
setsid() away from their leader, stopped and proven gone by each mechanism the box has."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.clock import SystemClock
from keelway.runtime import process, tree
from keelway.runtime.tree import Mechanism, ProcessTrees

GEN = 7
# The leader forks a child that setsid()s and forks again; the grandchild writes its pid
# and sleeps, detached from the leader's session and re-parented away from it.
DAEMONIZE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        {exec_line}
        open(sys.argv[1], "w").write(str(os.getpid()))
        time.sleep(60)
    os._exit(0)
os.wait()
{leader_tail}
"""
SLEEPS = "time.sleep(60)"
EXITS = "sys.exit(0)"


@pytest.fixture(params=["cgroup-v1", "cgroup-v2", "proc-scan"])
def trees(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcessTrees]:
    monkeypatch.setenv(tree.FORCE_ENV, request.param)
    chosen = ProcessTrees.choose(tmp_path / "home")
    if request.param != "proc-scan" and not chosen.uses_cgroups:
        pytest.skip(f"{request.param} is not writable on this box")
    yield chosen
    for members in chosen.scan().values():
        for member in members:
            os.kill(member.pid, signal.SIGKILL)
    time.sleep(0.05)
    chosen.remove(GEN)
    chosen.forget_home()


async def _spawn(trees: ProcessTrees, tmp_path: Path, leader_tail: str,
                 exec_line: str = "") -> tuple[process.Spawned, Path]:
    pidfile = tmp_path / "grandchild.pid"
    env = {**os.environ, tree.SUPERVISOR_MARK: str(trees.home_root),
           tree.GENERATION_MARK: str(GEN)}
    trees.create(GEN)
    code = DAEMONIZE.format(exec_line=exec_line, leader_tail=leader_tail)
    spawned = await process.spawn([sys.executable, "-c", code, str(pidfile)],
                                  cwd=tmp_path, env=env, log_path=tmp_path / "out.log",
                                  join=trees.join_paths(GEN))
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.01)
    return spawned, pidfile


def _dead(pid: int) -> bool:
    stat = process.read_stat(pid)
    return stat is None or stat.state == "Z"


def test_stopping_a_generation_kills_the_grandchild_that_left_its_session(
    trees: ProcessTrees, tmp_path: Path
) -> None:
    async def scenario() -> int:
        spawned, pidfile = await _spawn(trees, tmp_path, SLEEPS)
        grandchild = int(pidfile.read_text())
        assert process.read_stat(grandchild).session != spawned.pid  # type: ignore[union-attr]
        members = {m.pid for m in trees.members(GEN, (spawned.pid, spawned.start_ticks))}
        assert {spawned.pid, grandchild} <= members
        assert await tree.stop(trees, GEN, (spawned.pid, spawned.start_ticks), grace_s=2,
                               clock=SystemClock(), proc=spawned.proc)
        return grandchild

    grandchild = asyncio.run(scenario())
    assert _dead(grandchild)
    assert trees.remove(GEN)
    assert GEN not in trees.scan()


def test_a_tree_whose_leader_exited_is_not_gone_until_its_descendants_are(
    trees: ProcessTrees, tmp_path: Path
) -> None:
    async def scenario() -> int:
        spawned, pidfile = await _spawn(trees, tmp_path, EXITS)
        assert await spawned.proc.wait() == 0
        grandchild = int(pidfile.read_text())
        leader = (spawned.pid, spawned.start_ticks)
        assert not process.is_alive(*leader)
        assert [m.pid for m in trees.members(GEN, leader)] == [grandchild]
        assert [m.pid for m in trees.scan()[GEN]] == [grandchild]
        if trees.uses_cgroups:
            assert not trees.remove(GEN)  # the kernel refuses while a member lives
        assert await tree.stop(trees, GEN, leader, grace_s=0, clock=SystemClock())
        return grandchild

    assert _dead(asyncio.run(scenario()))
    assert trees.remove(GEN)


def test_only_a_cgroup_catches_a_descendant_that_clears_its_environment(
    trees: ProcessTrees, tmp_path: Path
) -> None:
    clears = ('os.execv("/usr/bin/env", ["env", "-i", sys.executable, "-c", '
              '"import os, sys, time; open(sys.argv[1], \'w\').write(str(os.getpid())); '
              'time.sleep(60)", sys.argv[1]])')

    async def scenario() -> tuple[int, bool]:
        spawned, pidfile = await _spawn(trees, tmp_path, EXITS, exec_line=clears)
        await spawned.proc.wait()
        grandchild = int(pidfile.read_text())
        leader = (spawned.pid, spawned.start_ticks)
        found = grandchild in {m.pid for m in trees.members(GEN, leader)}
        if found:
            assert await tree.stop(trees, GEN, leader, grace_s=0, clock=SystemClock())
        return grandchild, found

    grandchild, found = asyncio.run(scenario())
    if trees.uses_cgroups:
        assert found and _dead(grandchild)
    else:
        # The documented limit of proc-scan: no marker, no session, no way to find it.
        assert not found
        os.kill(grandchild, signal.SIGKILL)


def test_a_term_ignoring_tree_is_killed_after_the_grace_with_nothing_forked_away(
    trees: ProcessTrees, tmp_path: Path
) -> None:
    # The grandchild ignores SIGTERM and forks a new child every 20 ms:
    # only a tree held still (frozen or stopped) is killed whole.
    forks = ("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "        for _ in range(300):\n"
             "            if os.fork(): break\n"
             "            time.sleep(0.02)")

    async def scenario() -> None:
        spawned, _pidfile = await _spawn(trees, tmp_path, SLEEPS, exec_line=forks)
        await asyncio.sleep(0.2)
        leader = (spawned.pid, spawned.start_ticks)
        started = time.monotonic()
        assert await tree.stop(trees, GEN, leader, grace_s=0.3, clock=SystemClock(),
                               proc=spawned.proc)
        assert 0.3 <= time.monotonic() - started < 5
        assert trees.members(GEN, leader) == []

    asyncio.run(scenario())
    assert trees.remove(GEN)


def test_the_mechanism_says_what_it_is_for_doctor(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tree.FORCE_ENV, "proc-scan")
    assert ProcessTrees.choose(tmp_path).describe() == "proc-scan"
    monkeypatch.delenv(tree.FORCE_ENV)
    chosen = ProcessTrees.choose(tmp_path)
    assert chosen.describe() in {m.value for m in Mechanism}
    chosen.forget_home()


@pytest.mark.parametrize("start", ["vfork", "fork"])
def test_a_leader_that_cannot_join_its_cgroup_refuses_to_run_the_app(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    # A tree outside its cgroup could outlive its stop: better not to run at all. The
    # stub of a vfork-style start refuses as the forked child's setup does.
    if start == "fork":
        monkeypatch.setattr(process, "_vfork_start", False)
    broken = ProcessTrees(tmp_path, Mechanism.CGROUP_V1, (tmp_path / "no-such-cgroup",))
    argv = [sys.executable, "-c", "print('ran')"]

    async def scenario() -> int:
        spawned = await process.spawn(argv, cwd=tmp_path, env=dict(os.environ),
                                      log_path=tmp_path / "out.log",
                                      join=broken.join_paths(GEN))
        return await spawned.proc.wait()

    assert asyncio.run(scenario()) == 125
    log = (tmp_path / "out.log").read_text()
    assert "cannot join the cgroup" in log and "ran" not in log


def test_a_tree_started_in_a_cgroup_is_still_found_and_cleaned_under_proc_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A control plane with cgroups started it; the next one was told to use proc-scan.
    first = ProcessTrees.choose(tmp_path / "home")
    if not first.uses_cgroups:
        pytest.skip("no writable cgroup on this box")
    clears = ('open(sys.argv[1], "w").write(str(os.getpid())); '
              'os.execv("/usr/bin/env", ["env", "-i", "/bin/sleep", "60"])')

    async def scenario() -> None:
        spawned, _pidfile = await _spawn(first, tmp_path, EXITS, exec_line=clears)
        await spawned.proc.wait()
        monkeypatch.setenv(tree.FORCE_ENV, "proc-scan")
        later = ProcessTrees.choose(tmp_path / "home")
        assert later.mechanism is Mechanism.PROC_SCAN and later.legacy
        assert later.members(GEN, None), "the env-cleared member is only in the cgroup"
        assert await tree.stop(later, GEN, None, grace_s=0, clock=SystemClock())
        assert later.remove(GEN) and GEN not in later.scan()
        later.forget_home()

    asyncio.run(scenario())
    assert ProcessTrees.found(tmp_path / "home").homes == ()


def test_with_members_finds_what_members_finds_reading_proc_once_for_many(
        trees: ProcessTrees, tmp_path: Path) -> None:
    """The reconciler's survey asks of many generations at once: a tree whose leader
    exited but whose detached grandchild lives has members; a generation planned and
    not yet spawned (no cgroup, no leader) and one whose leader is dead and alone have
    none; by whichever mechanism the tree was made."""
    async def scenario() -> tuple[set[int], dict[int, bool]]:
        spawned, _pidfile = await _spawn(trees, tmp_path, EXITS)
        await spawned.proc.wait()
        leader = (spawned.pid, spawned.start_ticks)  # exited, reaped
        # GEN + 2: the same dead leader, but no cgroup and no marked process of its own.
        leaders: dict[int, tree.Leader | None] = {GEN: leader, GEN + 1: None,
                                                  GEN + 2: leader}
        one_by_one = {g: bool(trees.members(g, leader)) for g, leader in leaders.items()}
        return trees.with_members(leaders), one_by_one

    found, one_by_one = asyncio.run(scenario())
    assert found == {GEN} and one_by_one == {GEN: True, GEN + 1: False, GEN + 2: False}
