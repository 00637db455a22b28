"""A build step under its build's limits, with real processes and, where the box has
them, real cgroups (keelway/runtime/tree.py's BuildCell): past its memory it is killed
with the OOM reason, past its time or its disk with theirs, and it runs at nice 10.

Every hog bounds itself (at most 3x its limit, then it exits), so a box that enforces
nothing is hurt only briefly."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.builds.build_step import BUILD_NICE, Confine, StepLimits, run_step
from keelway.builds.errors import BuildCommandError, BuildLimitError
from keelway.builds.tree import disk_usage
from keelway.limits import BUILD_PIDS
from keelway.runtime.process import read_stat
from keelway.runtime.tree import BUILD_PREFIX, ProcessTrees

LIMIT = 64 << 20
# Allocates (and touches) 8M at a time up to 3x LIMIT, then exits 0: it fails only if
# something killed it.
HOG = ("b = []\n"
       "for _ in range(24):\n"
       "    b.append(b'x' * (8 << 20))\n"
       "print('allocated 192M', flush=True)\n")


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[ProcessTrees]:
    chosen = ProcessTrees.choose(tmp_path / "home")
    yield chosen
    chosen.forget_home()


def _run(argv: list[str], cwd: Path, limits: StepLimits) -> list[str]:
    lines: list[str] = []
    run_step(argv, what="the [build] command", cwd=cwd, env={"PATH": os.environ["PATH"]},
             log=io.BytesIO(), progress=lines.append, limits=limits)
    return lines


def _limits(tmp_path: Path, timeout_s: float = 60.0, memory: int | None = None,
            disk: int | None = None, confine: Confine | None = None) -> StepLimits:
    return StepLimits(time.monotonic() + timeout_s, timeout_s, memory=memory, disk=disk,
                      watched=(tmp_path,), confine=confine)


def test_a_step_past_its_memory_is_killed_and_said_out_of_memory(
        tmp_path: Path, trees: ProcessTrees) -> None:
    if "memory" not in trees.enforces():
        pytest.skip(f"no memory controller in reach ({trees.describe()}): build memory is "
                    "not enforced here; the fallback is checked by "
                    "test_without_cgroups_a_step_runs_unconfined_and_doctor_says_so")
    started = time.monotonic()
    with pytest.raises(BuildLimitError) as killed:
        _run(["python3", "-c", HOG], tmp_path,
             _limits(tmp_path, memory=LIMIT, confine=trees.build_cell))
    took = time.monotonic() - started
    print(f"OOM-killed build step failed in {took:.2f} s")
    assert killed.value.limit == "memory"
    assert killed.value.summary == ("build killed: out of memory at its 64M limit "
                                    "(in the [build] command)")
    assert took < 10, took
    # the step's cgroup is gone with it
    assert [c for h in trees.homes for c in os.listdir(h) if c.startswith(BUILD_PREFIX)] == []


def test_a_step_within_its_memory_passes_in_its_cgroup(
        tmp_path: Path, trees: ProcessTrees) -> None:
    if not trees.uses_cgroups:
        pytest.skip(f"no writable cgroup here ({trees.describe()})")
    said = _run(["sh", "-c", "cat /proc/self/cgroup"], tmp_path,
                _limits(tmp_path, memory=LIMIT, confine=trees.build_cell))
    inside = [line for line in said if f"/keelway/{trees.homes[0].name}/{BUILD_PREFIX}" in line]
    assert inside, said


def test_without_cgroups_a_step_runs_unconfined_and_doctor_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fallback where there is no memory controller: no cgroup, no RLIMIT_AS (it
    # breaks runtimes that reserve more address space than they use); the step runs,
    # and its time and disk limits still hold. (doctor: tests/e2e/test_build_limits.py)
    monkeypatch.setenv("KEELWAY_PROCESS_TREE", "proc-scan")
    scan = ProcessTrees.choose(tmp_path / "home")
    assert not scan.uses_cgroups and "memory" not in scan.enforces()
    said = _run(["python3", "-c", HOG], tmp_path, _limits(tmp_path, memory=LIMIT))
    assert said[-1] == "| allocated 192M"


def test_a_step_past_the_build_s_time_is_killed_with_the_time_reason(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(BuildLimitError) as killed:
        _run(["sh", "-c", "echo waiting; sleep 30 & sleep 30"], tmp_path,
             _limits(tmp_path, timeout_s=2.0))
    took = time.monotonic() - started
    assert killed.value.limit == "timeout"
    assert killed.value.summary == ("build took longer than its 2s limit "
                                    "(the [build] command was killed)")
    assert killed.value.tail == ["waiting"]
    assert 1.9 < took < 5, took


def test_the_time_limit_is_the_whole_build_s_not_each_step_s(tmp_path: Path) -> None:
    limits = _limits(tmp_path, timeout_s=2.0)
    _run(["sleep", "1.2"], tmp_path, limits)
    with pytest.raises(BuildLimitError, match="longer than its 2s limit"):
        _run(["sleep", "1.2"], tmp_path, limits)


def test_a_step_past_its_disk_is_killed_with_the_disk_reason(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    # 1M a write, up to 3x the 20M limit, slowly enough that the guard sees it growing
    grow = ("for i in $(seq 1 60); do head -c 1048576 /dev/urandom > f$i; sleep 0.05; done;"
            " echo wrote 60M")
    started = time.monotonic()
    with pytest.raises(BuildLimitError) as killed:
        _run(["sh", "-c", grow], tree, _limits(tree, disk=20 << 20))
    took = time.monotonic() - started
    assert killed.value.limit == "disk"
    assert killed.value.summary == ("build grew past its 20M disk limit "
                                    "(the [build] command was killed)")
    assert disk_usage([tree]) < 40 << 20  # stopped on its way, not at the end
    assert took < 3.5, took


def test_a_step_that_ends_past_its_disk_between_two_looks_still_fails(tmp_path: Path) -> None:
    with pytest.raises(BuildLimitError, match="grew past its 20M disk limit"):
        _run(["sh", "-c", "head -c 30000000 /dev/zero > big"], tmp_path,
             _limits(tmp_path, disk=20 << 20))


def test_the_disk_counts_a_hard_linked_file_once_and_a_sparse_one_by_its_blocks(
        tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * (1 << 20))
    os.link(tmp_path / "a", tmp_path / "b")
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(1 << 30)
    used = disk_usage([tmp_path])
    assert (1 << 20) <= used < (1 << 20) + (256 << 10)


@pytest.mark.slow
def test_a_disk_walk_of_a_big_tree_is_cheap(tmp_path: Path) -> None:
    # 20,000 small files in 200 directories: the size of a middling node_modules
    for d in range(200):
        sub = tmp_path / f"d{d}"
        sub.mkdir()
        for f in range(100):
            (sub / f"f{f}").write_bytes(b"x" * 100)
    # The walk's cost to the box is its CPU time (the watcher spaces walks by it): wall
    # time on a shared box also counts the time it waited for a CPU (1.06 s once in CI,
    # for some 80 ms of work).
    started = time.thread_time()
    disk_usage([tmp_path])
    took = time.thread_time() - started
    print(f"disk walk of 20,000 files: {took * 1000:.0f} ms of CPU")
    assert took < 1.0


def test_a_step_runs_at_nice_10_or_lower_priority(tmp_path: Path) -> None:
    # field 19 of /proc/self/stat is the nice value, read by the step's own process
    said = _run(["sh", "-c", "cut -d' ' -f19 /proc/self/stat; ionice -p $$ || true"],
                tmp_path, _limits(tmp_path))
    assert int(said[0].removeprefix("| ")) >= BUILD_NICE
    if len(said) > 1 and "idle" not in said[1]:
        pytest.fail(f"ionice said {said[1]!r}, not the idle class")


def test_a_descendant_that_leaves_the_step_s_group_dies_with_its_cgroup(
        tmp_path: Path, trees: ProcessTrees) -> None:
    if not trees.uses_cgroups:
        pytest.skip(f"no writable cgroup here ({trees.describe()}): a setsid() child of a "
                    "build step escapes its process group")
    pidfile = tmp_path / "escaped.pid"
    _run(["sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' "
                      "</dev/null >/dev/null 2>&1 & sleep 0.3"],
         tmp_path, _limits(tmp_path, memory=LIMIT, confine=trees.build_cell))
    escaped = int(pidfile.read_text())
    stat = read_stat(escaped)
    assert stat is None or stat.state == "Z", stat


def test_a_build_cgroup_left_by_a_crash_is_emptied_and_removed_at_boot(
        tmp_path: Path, trees: ProcessTrees) -> None:
    if not trees.uses_cgroups:
        pytest.skip(f"no writable cgroup here ({trees.describe()})")
    cell = trees.build_cell(LIMIT)  # as a control plane that died mid-step left it
    orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        cell.enter(orphan.pid)
        assert trees.sweep_build_cells() == [cell.name]
        assert orphan.wait(timeout=5) == -signal.SIGKILL
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    assert not any((home / cell.name).exists() for home in trees.homes)


def test_a_descendant_that_leaves_the_group_holding_the_output_does_not_hold_the_step(
        tmp_path: Path, trees: ProcessTrees) -> None:
    if not trees.uses_cgroups:
        pytest.skip(f"no writable cgroup here ({trees.describe()}): such a descendant "
                    "holds the step until it exits")
    started = time.monotonic()
    _run(["sh", "-c", "setsid sleep 60 & sleep 0.3; echo left"], tmp_path,
         _limits(tmp_path, memory=LIMIT, confine=trees.build_cell))
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_a_step_that_forks_past_its_process_limit_fails_saying_so(
        tmp_path: Path, trees: ProcessTrees) -> None:
    if "pids" not in trees.enforces():
        pytest.skip(f"no pids controller in reach ({trees.describe()})")
    # bounded: at most BUILD_PIDS + 76 sleeps of 2 s, should nothing stop it
    # (a thousand processes take more than 64M: the memory limit must not come first)
    bomb = f"for i in $(seq 1 {BUILD_PIDS + 76}); do sleep 2 & done; wait"
    with pytest.raises(BuildCommandError) as failed:
        _run(["sh", "-c", bomb], tmp_path,
             _limits(tmp_path, memory=1 << 30, confine=trees.build_cell))
    assert not isinstance(failed.value, BuildLimitError)
    assert failed.value.summary.endswith(f"(hit its limit of {BUILD_PIDS} processes)")
