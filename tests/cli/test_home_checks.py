"""The doctor's checks of the box alone (keelway/home_checks.py), from values and from
real files, sockets and a real router: the disk thresholds, the home's permission rule,
and the stdlib ping and settings reader held to the router's own wire and writer."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import msgspec
import pytest

from keelway.home import Home
from keelway.home_checks import (
    LOW_DISK_BYTES,
    Severity,
    accepts,
    disk_check,
    disk_finding,
    needs_person,
    open_to_others,
    permission_check,
    recorded_listeners,
    router_pid,
)
from keelway.router import control_wire as wire
from keelway.runtime.router import RouterSettings, record_settings

GIB = 1 << 30


@pytest.mark.parametrize(("free", "total", "severity"), [
    (50 * GIB, 100 * GIB, Severity.OK),
    (10 * GIB, 100 * GIB, Severity.OK),          # exactly 10%: not under it
    (int(9.9 * GIB), 100 * GIB, Severity.FAIL),  # under 10% of a big disk
    (LOW_DISK_BYTES, 4 * GIB, Severity.OK),      # 25% and exactly 1G
    (LOW_DISK_BYTES - 1, 2 * GIB, Severity.FAIL),  # under 1G of a small disk, 50% free
    (0, 0, Severity.FAIL),                        # nothing to read: no space
])
def test_the_disk_is_low_under_a_tenth_or_a_gigabyte_free(free: int, total: int,
                                                          severity: Severity) -> None:
    found = disk_finding(Path("/h"), free, total)
    assert found.severity is severity
    assert (found.fix is None) is (severity is Severity.OK)


def test_the_disk_check_reads_the_filesystem_under_the_home(tmp_path: Path) -> None:
    said = disk_check(tmp_path)
    assert str(tmp_path) in said.detail and "free of" in said.detail


def test_a_home_laid_down_by_keelway_is_owner_only_and_passes(home: Home) -> None:
    (home.root / "keelway.db").write_bytes(b"")
    os.chmod(home.root / "keelway.db", 0o600)
    home.open_to_tenants()  # 0711: tenants pass through, list nothing
    assert open_to_others(home.root, home.tenant_traversed) == []
    assert permission_check(home.root, home.tenant_traversed).severity is Severity.OK


def test_anything_others_may_read_or_write_is_named_with_its_mode(home: Home) -> None:
    env = home.env_file("a.test")
    env.write_text("SECRET=1\n")
    os.chmod(env, 0o644)
    os.chmod(home.root / "logs", 0o733)
    os.chmod(home.root, 0o755)
    (home.root / "current").rmdir()
    (home.root / "current").symlink_to(home.root / "builds")  # a link's own mode is moot
    found = {p: mode for p, mode in open_to_others(home.root, home.tenant_traversed)}
    assert found == {home.root: 0o755, env: 0o644, home.root / "logs": 0o733}
    check = permission_check(home.root, home.tenant_traversed)
    assert check.severity is Severity.FAIL and f"{env} (0644)" in check.detail
    assert check.fix is not None and check.fix.startswith("chmod go-rw ")


def test_needs_person_counts_failures_not_warnings() -> None:
    assert not needs_person([{"check": "a", "ok": False, "severity": "warn"}])
    assert needs_person([{"check": "a", "ok": False, "severity": "fail"}])
    # A check from before severities: not ok is a failure.
    assert needs_person([{"check": "a", "ok": False}])


def test_the_stdlib_ping_is_the_routers_own_ping_line(tmp_path: Path) -> None:
    # What home_checks sends, read by the router's own decoder, is its Ping.
    path = tmp_path / "control.sock"
    got: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                got.append(conn.recv(4096))
                conn.sendall(msgspec.json.encode(wire.Reply(ok=True, pid=4242)) + b"\n")

        thread = threading.Thread(target=answer)
        thread.start()
        assert router_pid(path) == 4242
        thread.join(5)
    assert isinstance(msgspec.json.decode(got[0].strip(), type=wire.ControlRequest), wire.Ping)


def test_no_router_answers_a_dead_socket(tmp_path: Path) -> None:
    assert router_pid(tmp_path / "nothing.sock", timeout_s=0.5) is None


def test_the_recorded_listeners_are_read_as_the_router_writes_them(home: Home) -> None:
    assert recorded_listeners(home.router_settings) == {}
    record_settings(home, "127.0.0.1:8080", RouterSettings(https="0.0.0.0:8443"))
    assert recorded_listeners(home.router_settings) == {"http": "127.0.0.1:8080",
                                                        "https": "0.0.0.0:8443"}
    record_settings(home, "127.0.0.1:8080", RouterSettings())
    assert recorded_listeners(home.router_settings) == {"http": "127.0.0.1:8080"}


def test_a_listener_accepts_or_says_why_not() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        assert accepts(f"127.0.0.1:{port}") is None
        assert accepts(f"0.0.0.0:{port}") is None  # a wildcard is probed on loopback
    assert accepts(f"127.0.0.1:{port}") is not None
    assert accepts("no-port") is not None
