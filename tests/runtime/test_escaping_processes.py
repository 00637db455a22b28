"""A daemonizing app (its web leaves a setsid()ed grandchild behind) through the real CLI
and daemon: after stop, redeploy, `down`, and a reconcile after a SIGKILLed control
plane, no process carrying the home's marker is alive unless a live record names its
generation (SPEC §5 invariant 5, §6). Run with cgroups where the box has them, and with
the proc-scan fallback forced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keelway.runtime import tree
from keelway.runtime.tree import ProcessTrees
from keelway.store import SqliteStore
from tests.deploy.apps import daemonizing
from tests.e2e.harness import Keelway, wait_until
from tests.invariants import violations

pytestmark = pytest.mark.slow


@pytest.fixture(params=["auto", "cgroup-v2", "proc-scan"])
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
              tmp_path: Path) -> str:
    """The daemon inherits the test's environment: "proc-scan" forces the fallback,
    "cgroup-v2" the v2 hierarchy (a hybrid box's too), where the box has one."""
    monkeypatch.setenv(tree.FORCE_ENV, request.param)
    if request.param == "cgroup-v2":
        probe = ProcessTrees.choose(tmp_path / "probe")
        probe.forget_home()
        if probe.mechanism is not tree.Mechanism.CGROUP_V2:
            pytest.skip("no writable cgroup v2 hierarchy on this box")
    return str(request.param)


def _trees(kw: Keelway) -> dict[int, list[int]]:
    """Every live process of the home's trees, by generation (cgroups and marker)."""
    return {g: [m.pid for m in members]
            for g, members in ProcessTrees.found(kw.home).scan().items() if members}


def _live_generations(kw: Keelway) -> set[int]:
    store = SqliteStore(kw.home / "keelway.db")
    try:
        return {g.id for g in store.generations.live_generations()}
    finally:
        store.close()


def _unnamed(kw: Keelway) -> dict[int, list[int]]:
    live = _live_generations(kw)
    return {g: pids for g, pids in _trees(kw).items() if g not in live}


def _web(kw: Keelway) -> dict[str, object]:
    inst = kw.ok("status", "--json").json()["apps"][0]["instances"][0]
    return next(p for p in inst["processes"] if p["service"] == "web" and p["active"])


def test_stop_redeploy_and_down_leave_no_process_of_a_daemonizing_app(
    kw: Keelway, tmp_path: Path, mechanism: str
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(daemonizing(tmp_path, "v1")), "--host", "one.test")
    first = int(_web(kw)["id"])  # type: ignore[call-overload]
    assert len(_trees(kw)[first]) >= 2  # the leader and its detached grandchild

    kw.ok("deploy", "hello", str(daemonizing(tmp_path, "v2", greeting="howdy from")))
    assert first not in _trees(kw), "the old web's daemonized child outlived the redeploy"
    assert _unnamed(kw) == {}

    kw.ok("stop", "hello")
    assert _trees(kw) == {}, "a process of the stopped instance is still alive"
    kw.ok("start", "hello")
    assert kw.get("one.test")[0] == 200

    kw.ok("down")
    assert _trees(kw) == {}, "a process outlived `keelway down`"
    assert ProcessTrees.found(kw.home).homes == (), "down left the home's cgroups"


def test_a_reconcile_after_a_killed_control_plane_removes_what_a_dead_leader_left(
    kw: Keelway, tmp_path: Path, mechanism: str
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(daemonizing(tmp_path, "v1")), "--host", "one.test")
    web = _web(kw)
    gen, pid = int(web["id"]), int(web["pid"])  # type: ignore[call-overload]
    kw.kill_daemon()
    os.kill(pid, signal.SIGKILL)  # the leader dies while nobody watches; its child lives
    assert wait_until(lambda: pid not in _trees(kw).get(gen, []), 5)
    assert _trees(kw).get(gen), "the daemonized grandchild should still be alive here"

    kw.up()
    assert gen not in _trees(kw), "boot left the dead leader's descendants alive"
    assert violations(kw.home) == []
    assert kw.get("one.test")[0] == 200  # and the web was restarted
    again = kw.ok("reconcile", "--dry-run", "--json").json()
    assert all(not item["actions"] for item in again["instances"]), again


def test_reconcile_finds_and_removes_a_process_that_no_live_record_names(
    kw: Keelway, tmp_path: Path
) -> None:
    # What an older keelway left behind: a daemonized child of a generation that its
    # record already calls gone (the leader's death was taken for the tree's).
    kw.up()
    kw.ok("deploy", "hello", str(daemonizing(tmp_path, "v1")), "--host", "one.test")
    old = int(_web(kw)["id"])  # type: ignore[call-overload]
    kw.ok("restart", "hello")
    assert old not in _live_generations(kw)
    env = {**os.environ, tree.SUPERVISOR_MARK: str(kw.home), tree.GENERATION_MARK: str(old)}
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env=env, start_new_session=True)
    try:
        assert wait_until(lambda: leftover.pid in _unnamed(kw).get(old, []), 5)
        report = kw.ok("reconcile", "--dry-run").out
        # The periodic pass (every 5 s) removes it too; until it does, reconcile says so.
        if leftover.poll() is None:
            assert f"would remove-tree generation {old}" in report
        kw.ok("reconcile")
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert _unnamed(kw) == {}
    finally:
        if leftover.poll() is None:
            leftover.kill()
