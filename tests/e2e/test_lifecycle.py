"""Redeploys, crashes, restarts of the control plane, gc, and every kind of source."""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from keelway.runtime import process
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = pytest.mark.slow


def _replicators(kw: Keelway) -> list[int]:
    """The live replicators' pids, as status says (keelway/data/replicas.py)."""
    return [p["pid"] for app in kw.ok("status", "--json").json()["apps"]
            for inst in app["instances"] for p in inst["processes"]
            if p["service"] == "replica" and p["state"] != "gone"]


def _web(kw: Keelway, host: str) -> dict[str, object]:
    (app,) = kw.ok("status", "--json").json()["apps"]
    inst = next(i for i in app["instances"] if i["host"] == host)
    return next(p for p in inst["processes"] if p["service"] == "web" and p["active"])


def test_a_crashed_web_process_is_restarted_and_served_again(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    before = _web(kw, "one.test")
    os.kill(int(str(before["pid"])), signal.SIGKILL)
    assert wait_until(lambda: _web(kw, "one.test")["id"] != before["id"]
                      and _web(kw, "one.test")["state"] == "ready", 20)
    assert kw.get("one.test")[0] == 200
    events = kw.ok("events", "hello", "--json").json()["events"]
    assert any("exited" in e["message"] for e in events)
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert ops[0]["kind"] == "restart-crashed" and ops[0]["state"] == "succeeded"


def test_a_redeploy_replaces_every_generation_without_a_failed_request(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    old_pids = kw.app_pids()
    failures: list[str] = []
    done = threading.Event()
    count = 0

    def hammer() -> None:
        nonlocal count
        while not done.is_set() and count < 20_000:
            try:
                status, _, _ = kw.get("one.test", "/health", timeout_s=5)
                if status != 200:
                    failures.append(str(status))
            except OSError as exc:
                failures.append(repr(exc))
            count += 1

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        kw.ok("deploy", "hello", str(EXAMPLE))
    finally:
        done.set()
        thread.join(30)
    assert count > 10 and failures == []
    assert kw.get("one.test")[1].startswith(b"hello from one.test (v2)")
    assert not any(process.is_alive(pid, ticks) for pid, ticks in old_pids)
    releases = kw.ok("releases", "hello", "--json").json()["releases"]
    assert [r["version"] for r in releases] == ["v2", "v1"]
    current = (kw.home / "current" / "one.test").resolve()
    assert current.parent.parent == (kw.home / "builds").resolve()


def test_down_keep_apps_then_up_adopts_the_running_processes(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    pids = kw.app_pids()
    kw.started_pids.extend(pids)
    replicators = _replicators(kw)
    assert len(replicators) == (1 if kw.replicate else 0)
    kw.ok("down", "--keep-apps")
    assert all(process.is_alive(pid, ticks) for pid, ticks in pids)
    kw.up()
    assert kw.app_pids() == pids
    assert _replicators(kw) == replicators  # it ran on with its app, and is adopted
    assert kw.get("one.test")[0] == 200
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert [op["kind"] for op in ops] == ["deploy"]  # adoption journals nothing


def test_down_then_up_starts_the_apps_again(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    pids = kw.app_pids()
    kw.ok("down")
    assert not any(process.is_alive(pid, ticks) for pid, ticks in pids)
    kw.up()
    assert kw.get("one.test")[1].startswith(b"hello from one.test (v1)")
    assert set(kw.app_pids()).isdisjoint(pids)


def test_a_sigkilled_control_plane_leaves_apps_serving_and_recovers(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    pids = kw.app_pids()
    kw.started_pids.extend(pids)
    kw.kill_daemon()
    # The router is its own process: traffic keeps flowing while the control plane is dead.
    assert kw.get("one.test")[0] == 200
    kw.up()
    assert kw.app_pids() == pids
    assert kw.get("one.test")[0] == 200


def test_gc_removes_only_builds_that_nothing_names(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "Procfile").write_text("web: python3 -c 'raise SystemExit(1)'\n")
    assert kw.run("deploy", "hello", str(broken)).code == 1
    dry = kw.ok("gc", "--dry-run", "--json").json()
    assert len(dry["removed"]) == 1 and dry["dry_run"]
    removed = kw.ok("gc", "--json").json()["removed"]
    assert removed == dry["removed"]
    builds = list((kw.home / "builds" / "hello").iterdir())
    assert [b.name for b in builds if not b.name.startswith(".")] != []
    assert not (kw.home / "builds" / "hello" / removed[0]["digest"]).exists()
    assert kw.ok("gc", "--json").json()["removed"] == []
    assert kw.get("one.test")[0] == 200


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.invalid",
                    "-c", "user.name=t", *args], check=True, capture_output=True)


def test_deploys_from_a_git_ref_and_from_a_tarball(kw: Keelway, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["cp", "-r", str(EXAMPLE), str(repo)], check=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    _git(repo, "tag", "first")
    (repo / "web.py").write_text((repo / "web.py").read_text().replace("hello from", "hi from"))
    _git(repo, "commit", "-qam", "two")
    kw.up()
    kw.ok("deploy", "hello", str(repo), "--ref", "first", "--host", "one.test")
    assert kw.get("one.test")[1].startswith(b"hello from")
    kw.ok("deploy", "hello", str(repo), "--git")
    assert kw.get("one.test")[1].startswith(b"hi from")
    tarball = tmp_path / "hello.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(EXAMPLE, arcname="hello")
    kw.ok("deploy", "hello", str(tarball))
    assert kw.get("one.test")[1].startswith(b"hello from one.test (v3)")
