"""`keelway doctor` against a real daemon: each condition made to happen for real, the
finding checked (with what to do, and exit 1), then fixed and the check seen to pass.
The disk's thresholds are tested from values (tests/cli/test_home_checks.py): filling
a disk is not a test's to do."""

from __future__ import annotations

import datetime
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import trustme

from keelway.data.replicas import litestream_binary
from keelway.store import SqliteStore
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, Result, free_port, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"


def _doctor(kw: Keelway) -> tuple[Result, dict[str, dict[str, Any]]]:
    done = kw.run("doctor", "--json")
    checks = done.json()["checks"]
    # Exit 1 exactly when a check needs a person.
    assert done.code == (1 if any(c["severity"] == "fail" for c in checks) else 0), checks
    return done, {c["check"]: c for c in checks}


def _finding(kw: Keelway, name: str) -> dict[str, Any]:
    done, checks = _doctor(kw)
    check = checks[name]
    assert check["severity"] == "fail" and not check["ok"] and check["fix"], check
    assert done.code == 1
    return check


def _passes(kw: Keelway, name: str) -> dict[str, Any]:
    _done, checks = _doctor(kw)
    assert checks[name]["ok"] and checks[name]["fix"] is None, checks[name]
    return checks[name]


def test_every_check_of_a_healthy_box_passes_or_says_what_the_box_cannot_do(
        kw: Keelway) -> None:
    kw.up()
    done, checks = _doctor(kw)
    for name in ("router", "http port", "disk space", "home permissions", "failed closed",
                 "leftovers", "restore drills", "certificate expiry", "certificates"):
        assert checks[name]["ok"], checks[name]
    assert all(c["severity"] in ("ok", "warn") for c in checks.values())
    assert done.code == 0
    words = kw.run("doctor")
    assert words.code == 0 and "ok   router:" in words.out


def test_a_home_others_can_read_is_named_until_it_is_owner_only_again(kw: Keelway) -> None:
    kw.up()
    db = kw.home / "keelway.db"
    mode = stat.S_IMODE(kw.home.stat().st_mode)
    os.chmod(kw.home, 0o755)
    os.chmod(db, 0o644)
    check = _finding(kw, "home permissions")
    assert f"{db} (0644)" in check["detail"] and f"{kw.home} (0755)" in check["detail"]
    assert check["fix"].startswith("chmod go-rw")
    os.chmod(kw.home, mode)
    os.chmod(db, 0o600)
    _passes(kw, "home permissions")


def test_with_the_control_plane_down_the_doctor_checks_the_box_and_says_so(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("down", "--keep-apps")  # the router outlives the control plane
    done = kw.run("doctor", "--json")
    checks = {c["check"]: c for c in done.json()["checks"]}
    assert done.code == 1 and done.json()["control_plane"] is False
    assert checks["control plane"]["severity"] == "fail"
    assert "not running" in checks["control plane"]["detail"]
    assert checks["router"]["ok"] and checks["http port"]["ok"]
    assert checks["home permissions"]["ok"] and "disk space" in checks

    kw.up()
    kw.ok("down")  # the router too: nothing answers, nothing listens
    done = kw.run("doctor", "--json")
    checks = {c["check"]: c for c in done.json()["checks"]}
    assert done.code == 1
    assert not checks["router"]["ok"] and "router restart" in checks["router"]["fix"]
    assert not checks["http port"]["ok"]
    assert f"127.0.0.1:{kw.http_port}" in checks["http port"]["detail"]
    words = kw.run("doctor")
    assert "FAIL control plane" in words.out and "fix: `keelway up -d`" in words.out

    kw.up()
    _passes(kw, "router")
    _passes(kw, "http port")


def _short_lived(tmp_path: Path, days: int) -> tuple[str, str]:
    now = datetime.datetime.now(datetime.UTC)
    issued = trustme.CA().issue_cert(HOST, not_before=now - datetime.timedelta(days=1),
                                     not_after=now + datetime.timedelta(days=days))
    cert, key = tmp_path / f"{days}.pem", tmp_path / f"{days}.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


def test_a_certificate_within_two_weeks_of_its_end_is_named_until_replaced(
        kw: Keelway, tmp_path: Path) -> None:
    https = free_port()
    kw.up("--https", f"127.0.0.1:{https}", "--acme-directory", "off")
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    assert _passes(kw, "https port")["detail"] == f"127.0.0.1:{https} accepts connections"
    kw.ok("certs", "import", HOST, *_short_lived(tmp_path, 5))
    check = _finding(kw, "certificate expiry")
    assert HOST in check["detail"] and "in 4 days" in check["detail"]
    assert f"keelway certs renew {HOST}" in check["fix"]
    kw.ok("certs", "import", HOST, *_short_lived(tmp_path, 60))
    _passes(kw, "certificate expiry")


def test_a_failed_restore_drill_is_named_until_a_drill_passes(kw: Keelway,
                                                              tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    snap = kw.ok("db", "snapshot", HOST, "--json").json()["id"]
    copy = kw.home / "objects" / "instances" / HOST / "snapshots" / f"{snap}.db"
    copy.write_bytes(b"\xff" * copy.stat().st_size)  # the stored copy rots
    assert kw.run("db", "drill", HOST).code == 1
    check = _finding(kw, "restore drills")
    assert HOST in check["detail"] and f"keelway db drill {HOST}" in check["fix"]
    kw.ok("db", "snapshot", HOST)  # a sound copy, now the newest
    kw.ok("db", "drill", HOST)
    _passes(kw, "restore drills")


def test_an_awake_instance_whose_replicator_keeps_dying_is_named_until_it_runs(
        kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = litestream_binary()
    if real is None:
        pytest.skip("no litestream: replication is off on this box")
    broken = tmp_path / "broken"
    # A litestream that fails to start while `broken` exists: the object store is gone.
    fake = tmp_path / "litestream"
    fake.write_text(f"#!/bin/sh\n[ -e {broken} ] && exit 1\nexec {real} \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KEELWAY_LITESTREAM", str(fake))
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    _passes(kw, "replicas")
    broken.touch()
    [replicator] = [p["pid"] for p in kw.ok("status", "--json").json()["apps"][0][
        "instances"][0]["processes"] if p["service"] == "replica" and p["pid"]]
    os.kill(replicator, signal.SIGKILL)
    assert wait_until(lambda: not _doctor(kw)[1]["replicas"]["ok"], 30)
    check = _finding(kw, "replicas")
    assert HOST in check["detail"] and "--service replica" in check["fix"]
    broken.unlink()
    assert wait_until(lambda: _doctor(kw)[1]["replicas"]["ok"], 90)


def test_an_instance_failed_closed_and_its_leftover_are_named_until_removed(
        kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    kw.started_pids.extend(kw.app_pids())
    kw.ok("down", "--keep-apps")
    # The control plane dies once the next deploy's web candidate is ready, before it is
    # published; the next one cannot stop that candidate (keelway/testing/danger.py).
    monkeypatch.setenv("KEELWAY_FAILPOINTS", "ready.after")
    kw.up()
    monkeypatch.delenv("KEELWAY_FAILPOINTS")
    kw.run("deploy", "hello", str(hello(tmp_path, "v2", greeting="v2")))
    assert wait_until(lambda: not Path(f"/proc/{kw.daemon_pid}").exists()
                      or "Z" in Path(f"/proc/{kw.daemon_pid}/stat").read_text().split()[2])
    store = SqliteStore(kw.home / "keelway.db")
    candidate = max(g.id for g in store.generations.recent_generations(HOST, limit=100)
                    if g.service == "web")
    store.close()
    kw.unkillable = frozenset({candidate})
    try:
        kw.up()
    finally:
        kw.unkillable = frozenset()
    closed = _finding(kw, "failed closed")
    assert HOST in closed["detail"] and f"web generation {candidate}" in closed["detail"]
    assert "keelway reconcile" in closed["fix"]
    # Its process is a leftover too: live, and no record of a live operation names it.
    left = _finding(kw, "leftovers")
    assert f"{HOST} web generation {candidate}" in left["detail"]

    store = SqliteStore(kw.home / "keelway.db")
    leftover = store.local.presence(candidate)
    store.close()
    assert leftover is not None and leftover.pid is not None
    os.kill(leftover.pid, signal.SIGKILL)  # what the fix says: stop it, then converge
    kw.ok("reconcile")
    _passes(kw, "failed closed")
    _passes(kw, "leftovers")
