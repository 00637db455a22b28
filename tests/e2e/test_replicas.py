"""Continuous replicas of instance databases through the real CLI: one replicator per
awake instance, synced and stopped by a park, restarted when killed; a restore from the
replica after the database is lost; drills that pass, and one that fails."""

from __future__ import annotations

import datetime
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from keelway.data.replicas import litestream_binary, verify
from keelway.runtime import process
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(litestream_binary() is None, reason="no litestream")]

HOST = "one.test"


def _replicators(kw: Keelway) -> list[int]:
    """Live litestream processes of this home, as /proc says (not as keelway says)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        stat = process.read_stat(int(entry.name))
        if (stat is not None and stat.state != "Z" and b"replicate" in argv
                and any(a.endswith(b"litestream") for a in argv)
                and f"KEELWAY_SUPERVISOR={kw.home}".encode() in env):
            found.append(int(entry.name))
    return found


def _write(db: Path, *values: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE IF NOT EXISTS notes(body TEXT)")
    conn.executemany("INSERT INTO notes VALUES (?)", [(v,) for v in values])
    conn.commit()
    conn.close()


def _rows(db: Path) -> list[tuple[str]]:
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT body FROM notes ORDER BY rowid").fetchall()
    finally:
        conn.close()


def _restore_replica(kw: Keelway, out: Path) -> None:
    binary = litestream_binary()
    assert binary is not None
    replica = kw.home / "objects" / "replicas" / HOST
    subprocess.run([str(binary), "restore", "-o", str(out), replica.as_uri()], check=True,
                   capture_output=True, timeout=60)


def _deployed(kw: Keelway) -> Path:
    kw.replicate = True
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    return kw.home / "data" / HOST / "db.sqlite3"


def test_an_awake_instance_has_one_replicator_a_park_syncs_and_stops_it_a_wake_starts_it(
        kw: Keelway, tmp_path: Path) -> None:
    db = _deployed(kw)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    _write(db, "one", "two")
    kw.ok("park", HOST)
    assert _replicators(kw) == []
    # Parked: the replica is current, with no replicator running.
    out = tmp_path / "parked.db"
    _restore_replica(kw, out)
    assert _rows(out) == [("one",), ("two",)] and verify(out) is None
    kw.ok("wake", HOST)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    status = kw.ok("db", "replicas", HOST, "--json").json()
    assert status["replicating"] and status["latest_txid"] >= 1


def test_a_killed_replicator_is_restarted(kw: Keelway) -> None:
    _deployed(kw)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    [pid] = _replicators(kw)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: [p for p in _replicators(kw) if p != pid] != [], timeout_s=20)
    assert len(_replicators(kw)) == 1


def test_a_replica_restores_an_identical_database_after_the_original_is_deleted(
        kw: Keelway) -> None:
    db = _deployed(kw)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    _write(db, *(f"row {i}" for i in range(200)))
    before = _rows(db)
    kw.ok("park", HOST)  # the last sync: the replica holds every row
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    done = kw.ok("db", "restore", HOST, "--from-replica", "--json").json()
    assert done["host"] == HOST
    assert _rows(db) == before and verify(db) is None
    kw.ok("wake", HOST)
    assert kw.get(HOST, "/")[0] == 200


def test_a_drill_passes_and_a_corrupted_replica_fails_it_with_an_event(kw: Keelway) -> None:
    db = _deployed(kw)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    _write(db, "kept")
    kw.ok("park", HOST)
    passed = kw.ok("db", "drill", HOST, "--json").json()
    assert passed["ok"] and passed["results"][0]["ok"]
    for ltx in (kw.home / "objects" / "replicas" / HOST).rglob("*.ltx"):
        data = bytearray(ltx.read_bytes())
        data[len(data) // 2:] = b"\xff" * (len(data) - len(data) // 2)
        ltx.write_bytes(bytes(data))
    failed = kw.run("db", "drill", HOST, "--json")
    assert failed.code == 1 and not failed.json()["results"][0]["ok"]
    events = kw.ok("events", "hello", "--json").json()
    assert any(e["kind"] == "drill-failed" for e in events["events"])
    [inst] = kw.ok("status", "--json").json()["apps"][0]["instances"]
    assert inst["drill"]["ok"] is False


def test_a_restore_at_a_time_brings_back_the_rows_committed_before_it(kw: Keelway) -> None:
    db = _deployed(kw)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    _write(db, "early")
    time.sleep(2.5)  # litestream's timestamps are whole seconds
    at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    time.sleep(1.5)
    _write(db, "late")
    time.sleep(1.5)
    kw.ok("db", "restore", HOST, "--from-replica", "--at", at)
    assert _rows(db) == [("early",)] and verify(db) is None
    assert kw.get(HOST, "/")[0] == 200


def test_a_restore_with_a_bad_time_or_no_replica_changes_nothing(kw: Keelway) -> None:
    kw.replicate = True
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    bad = kw.run("db", "restore", HOST, "--from-replica", "--at", "yesterday")
    assert bad.code != 0 and "not a time" in bad.err + bad.out
    unknown = kw.run("db", "restore", "nope.test", "--from-replica")
    assert unknown.code != 0 and "no instance" in unknown.err + unknown.out


def test_a_drill_of_every_instance_skips_one_that_never_ran(kw: Keelway) -> None:
    _deployed(kw)
    assert wait_until(lambda: len(_replicators(kw)) == 1, timeout_s=10)
    assert wait_until(lambda: kw.ok("db", "replicas", HOST, "--json").json()["files"],
                      timeout_s=10)  # its first snapshot is shipped
    kw.ok("instances", "add", "hello", "two.test", "--parked")
    drilled = kw.ok("db", "drill", "--json").json()
    by_host = {r["host"]: r for r in drilled["results"]}
    assert drilled["ok"] and by_host[HOST]["ok"] is True
    assert by_host["two.test"]["ok"] is None and by_host["two.test"]["skipped"]
