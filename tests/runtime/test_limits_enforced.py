"""A tenant's limits on real processes (keelway/runtime/limits.py, runtime/tree.py): its
cgroup's memory, process and CPU bounds, its rlimits and its OOM score, by both ways a
child is started. Each hog here bounds itself, so a box that enforces nothing is hurt
only briefly; a limit the box cannot enforce is skipped, saying so."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.limits import Limits
from keelway.runtime import process, tree
from keelway.runtime.limits import TENANT_OOM_SCORE, tenant_bounds
from keelway.runtime.tree import ProcessTrees

GEN = 41
# Allocates up to 400 MB in 8 MB steps, touching every page, then says it survived.
HOG = """
import sys
chunks = []
for _ in range(50):
    chunks.append(bytearray(8 << 20))
print("survived", flush=True)
"""
# Forks up to 64 sleepers (each gone within 3 s), then says how many forks succeeded.
BOMB = """
import os, sys, time
made = 0
for _ in range(64):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        made += 1
    except OSError:
        break
print("forked", made, flush=True)
sys.exit(3)
"""
SAYS = ("import resource, sys; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], "
        "open('/proc/self/oom_score_adj').read().strip(), flush=True)")


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[ProcessTrees]:
    chosen = ProcessTrees.choose(tmp_path / "home")
    if not chosen.uses_cgroups:
        pytest.skip("no writable cgroup on this box")
    yield chosen
    for members in chosen.scan().values():
        for member in members:
            os.kill(member.pid, signal.SIGKILL)
    time.sleep(0.1)
    chosen.remove(GEN)
    chosen.forget_home()


def _run(trees: ProcessTrees, tmp_path: Path, code: str, limits: Limits) -> tuple[int, str]:
    async def scenario() -> int:
        trees.create(GEN, limits)
        spawned = await process.spawn(
            [sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ),
            log_path=tmp_path / "out.log", join=trees.join_paths(GEN),
            bounds=tenant_bounds(limits, trees.enforces(), own_uids=False))
        return await asyncio.wait_for(spawned.proc.wait(), 30)

    code_ = asyncio.run(scenario())
    return code_, (tmp_path / "out.log").read_text()


def test_a_tree_past_its_memory_limit_is_killed_and_the_cause_says_so(
        trees: ProcessTrees, tmp_path: Path) -> None:
    if "memory" not in trees.enforces():
        pytest.skip(f"this box enforces no memory limit ({trees.describe()})")
    code, out = _run(trees, tmp_path, HOG, Limits(memory=64 << 20))
    assert code == -signal.SIGKILL and "survived" not in out
    assert trees.exit_cause(GEN) == "killed: out of memory at its 64M limit"


def test_a_fork_bomb_stops_at_its_process_limit_and_the_cause_says_so(
        trees: ProcessTrees, tmp_path: Path) -> None:
    if "pids" not in trees.enforces():
        pytest.skip(f"this box enforces no pids limit ({trees.describe()})")
    code, out = _run(trees, tmp_path, BOMB, Limits(pids=16))
    made = int(out.split("forked", 1)[1].split()[0])
    assert code == 3 and made < 16
    assert trees.exit_cause(GEN) == "hit its limit of 16 processes"


def test_a_cpu_quota_is_written_as_cores(trees: ProcessTrees) -> None:
    if "cpu" not in trees.enforces():
        pytest.skip(f"this box enforces no cpu limit ({trees.describe()})")
    trees.create(GEN, Limits(cpu=0.5))
    (home,) = [h for h in trees.homes if tree._controller(h) in ("cpu", "unified")]
    written = home / f"g{GEN}"
    if (written / "cpu.max").exists():
        assert (written / "cpu.max").read_text().split() == ["50000", "100000"]
    else:
        assert (written / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert trees.exit_cause(GEN) is None


@pytest.mark.parametrize("start", ["vfork", "fork"])
def test_a_tenant_takes_its_open_files_limit_and_oom_score_either_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    if start == "fork":
        monkeypatch.setattr(process, "_vfork_start", False)
    bounds = process.Bounds(nofile=256, oom_score_adj=TENANT_OOM_SCORE)

    async def scenario() -> int:
        spawned = await process.spawn([sys.executable, "-S", "-c", SAYS], cwd=tmp_path,
                                      env=dict(os.environ), log_path=tmp_path / "out.log",
                                      bounds=bounds)
        return await spawned.proc.wait()

    assert asyncio.run(scenario()) == 0
    assert (tmp_path / "out.log").read_text().split() == ["256", str(TENANT_OOM_SCORE)]


def test_without_a_pids_controller_the_process_limit_is_a_uids_and_only_its_own() -> None:
    limits = Limits(pids=64, nofile=1024)
    assert tenant_bounds(limits, {"pids": "cgroup v1 pids"}, own_uids=True).nproc is None
    assert tenant_bounds(limits, {}, own_uids=True).nproc == 64
    # Shared by every tenant, or keelway's own uid: a per-uid count would starve others.
    assert tenant_bounds(limits, {}, own_uids=False).nproc is None


def test_the_apps_of_a_home_are_bounded_together_leaving_the_box_its_reserve(
        trees: ProcessTrees, tmp_path: Path) -> None:
    """A tenth of the box's memory (at least 512M) stays keelway's, the router's and the
    kernel's, whatever the apps do together."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1 kB\n")
    total = 24_000_000 * 1024
    assert tree.apps_budget(meminfo) == (total - total // 10) // 4096 * 4096
    meminfo.write_text("MemTotal:        2000000 kB\n")
    assert tree.apps_budget(meminfo) == 2_000_000 * 1024 - (512 << 20)
    if "memory" not in trees.enforces():
        pytest.skip(f"this box enforces no memory limit ({trees.describe()})")
    assert trees.apps_budget() == tree.apps_budget()


# Holds 48 MB (every page touched) and burns a little CPU, then waits to be read.
HOLDER = """
import sys, time
held = bytearray(48 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("holding", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("by_cgroup", [True, False])
def test_a_trees_memory_and_cpu_use_are_read_as_status_shows_them(
        tmp_path: Path, by_cgroup: bool) -> None:
    chosen = ProcessTrees.choose(tmp_path / "home")
    if by_cgroup and not chosen.uses_cgroups:
        pytest.skip("no writable cgroup on this box")
    trees = chosen if by_cgroup else ProcessTrees(tmp_path / "home", tree.Mechanism.PROC_SCAN)

    async def scenario() -> tree.Usage:
        trees.create(GEN, None)
        spawned = await process.spawn(
            [sys.executable, "-S", "-c", HOLDER], cwd=tmp_path, env=dict(os.environ),
            log_path=tmp_path / "out.log", join=trees.join_paths(GEN))
        try:
            deadline = time.monotonic() + 20
            while "holding" not in (tmp_path / "out.log").read_text():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            return trees.usage(GEN, (spawned.pid, spawned.start_ticks))
        finally:
            os.kill(spawned.pid, signal.SIGKILL)
            await spawned.proc.wait()

    try:
        used = asyncio.run(scenario())
    finally:
        if by_cgroup:
            time.sleep(0.1)
            trees.remove(GEN)
            trees.forget_home()
    assert used.memory_bytes is not None and used.memory_bytes >= 40 << 20
    assert used.cpu_s is not None and used.cpu_s >= 0.25
    # Gone: nothing to say of it.
    assert trees.usage(GEN, None) == tree.Usage(None, None)
