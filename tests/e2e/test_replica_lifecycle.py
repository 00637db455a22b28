"""The replicator's lifecycle beyond park and wake, through the real CLI: `down` stops
the apps and then syncs each replica last (`down --keep-apps` leaves it running:
tests/e2e/test_lifecycle.py), and a replicator that cannot be stopped does not fail the
park it follows, nor does a crash in it, after which boot syncs the replica
(keelway/deploy/replica_keeper.py keep_replica, sync_replica)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from keelway.data.replicas import litestream_binary, verify
from keelway.runtime import process
from tests.e2e.harness import EXAMPLE, Keelway, gone, wait_until
from tests.e2e.test_replicas import HOST, _replicators, _restore_replica, _rows, _write

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(litestream_binary() is None, reason="no litestream")]


def _deployed(kw: Keelway) -> Path:
    kw.replicate = True
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    return kw.home / "data" / HOST / "db.sqlite3"


def test_down_syncs_each_replica_last_so_it_restores_every_row(
        kw: Keelway, tmp_path: Path) -> None:
    db = _deployed(kw)
    _write(db, *(f"row {i}" for i in range(100)))
    rows = _rows(db)
    kw.ok("down")
    assert _replicators(kw) == []
    log = (kw.home / "logs" / "keelway.log").read_text()
    assert "down: 1 of 1 replicas synced" in log
    out = tmp_path / "after-down.db"
    _restore_replica(kw, out)
    assert _rows(out) == rows and verify(out) is None


def test_a_replicator_that_cannot_be_stopped_warns_and_does_not_fail_the_park(
        kw: Keelway, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh home numbers its generations in order: web 1, worker 2, the replicator 3.
    monkeypatch.setenv("KEELWAY_TESTING_UNKILLABLE", "3")
    _deployed(kw)
    [inst] = kw.ok("status", "--json").json()["apps"][0]["instances"]
    assert [p["id"] for p in inst["processes"] if p["service"] == "replica"] == [3]
    kw.ok("park", HOST)
    [park] = kw.ok("ops", "hello", "--json").json()["operations"][:1]
    assert park["kind"] == "park" and park["state"] == "succeeded"
    assert any("replicator" in w for w in park["warnings"])
    # Still named by its record (invariant 5), and the app itself is gone.
    [inst] = kw.ok("status", "--json").json()["apps"][0]["instances"]
    assert [p["id"] for p in inst["processes"] if p["state"] != "gone"] == [3]
    assert kw.app_pids() == [] and all(process.read_stat(p) is not None
                                       for p in _replicators(kw))


def test_a_crash_in_the_parks_replicator_step_keeps_the_park_and_boot_syncs_the_replica(
        kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEELWAY_FAILPOINTS", "replica.stop.before")
    db = _deployed(kw)
    [replicator] = _replicators(kw)
    os.kill(replicator, signal.SIGSTOP)  # what is written now, it never ships
    _write(db, *(f"row {i}" for i in range(50)))
    rows = _rows(db)
    assert kw.run("park", HOST).code != 0  # the control plane dies after the app stopped
    assert kw.daemon_pid is not None and gone(kw.daemon_pid)
    os.kill(replicator, signal.SIGKILL)
    assert gone(replicator)
    monkeypatch.delenv("KEELWAY_FAILPOINTS")
    kw.up()
    [park] = kw.ok("ops", "hello", "--json").json()["operations"][:1]
    assert park["kind"] == "park" and park["state"] == "succeeded", park
    out = tmp_path / "after-boot.db"
    _restore_replica(kw, out)
    assert _rows(out) == rows and verify(out) is None
