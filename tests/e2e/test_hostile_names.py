"""Names and values one tenant gets wrong never hurt another tenant (SPEC §6).

A hostname that passed `deploy` but not the router's table once made every later
operation of every app fail with "internal error" and was journaled as a crash. These
drive the real CLI and daemon: such a name is refused up front; a route the router
refuses anyway (one written by an older keelway) fails only its own instance, saying
why; an exception inside an operation is journaled and answered as what it is.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from keelway.router.client import get_table_sync
from keelway.store import SqliteStore
from keelway.store.lifecycle import RouteState
from tests.e2e.harness import EXAMPLE, Keelway

pytestmark = pytest.mark.slow

CRASH = "interrupted by a control-plane crash"


def _serves(kw: Keelway, host: str, release: str) -> bool:
    status, body, _ = kw.get(host)
    return status == 200 and body.startswith(f"hello from {host} ({release})".encode())


def _post(sock_path: Path, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """One API request as any client could send it (the CLI's argv cannot carry a NUL)."""
    payload = json.dumps(body).encode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(sock_path))
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: keelway\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (path.encode(), len(payload), payload))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(rest)


def _ops(kw: Keelway, app: str) -> list[dict[str, object]]:
    return kw.ok("ops", app, "--json").json()["operations"]  # type: ignore[no-any-return]


def test_a_hostname_the_router_would_refuse_is_refused_at_deploy_and_every_app_keeps_working(
    kw: Keelway,
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    before = kw.store_dump()
    for host in ("two.test\n", "Two.test", "two.test:8080", "two.test.", "under_score.test"):
        result = kw.run("deploy", "other", str(EXAMPLE), "--host", host, "--json")
        assert result.code == 1, host
        error = result.json()["error"]
        assert error["code"] == "bad-request" and "not a valid hostname" in error["message"]
    assert kw.store_dump() == before
    # Every later operation of the app already there works, and its route stays right.
    kw.ok("restart", "hello")
    assert _serves(kw, "one.test", "v1")
    kw.ok("config", "hello", "set", "GREETING=hi")
    assert _serves(kw, "one.test", "v2")
    kw.ok("stop", "hello")
    assert kw.get("one.test")[0] == 503
    kw.ok("start", "hello")
    assert _serves(kw, "one.test", "v2")
    kw.ok("deploy", "other", str(EXAMPLE), "--host", "two.test")
    assert _serves(kw, "two.test", "v1") and _serves(kw, "one.test", "v2")
    assert all(op["state"] == "succeeded" for op in _ops(kw, "hello"))


def test_a_route_the_router_refuses_fails_only_its_own_instance_and_says_why(
    kw: Keelway,
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    kw.ok("deploy", "other", str(EXAMPLE), "--host", "two.test")
    kw.ok("down")
    # A route row today's rules refuse, as an older keelway wrote them (its deploy let
    # "two.test\n" through): it belongs to other's instance.
    store = SqliteStore(kw.home / "keelway.db")
    try:
        store.routes.set_route("two.test\n", "two.test", RouteState.GATED, None, None,
                               expected=None)
    finally:
        store.close()
    kw.up()
    assert _serves(kw, "one.test", "v1") and _serves(kw, "two.test", "v1")
    served = get_table_sync(kw.home / "router" / "control.sock").routes
    assert sorted(served) == ["one.test", "two.test"]
    # Every other app's operations and routes go on as if nothing were wrong.
    kw.ok("restart", "hello")
    kw.ok("config", "hello", "set", "GREETING=hi")
    assert _serves(kw, "one.test", "v2")
    kw.ok("stop", "hello")
    assert kw.get("one.test")[0] == 503 and _serves(kw, "two.test", "v1")
    kw.ok("start", "hello")
    assert _serves(kw, "one.test", "v2")
    # The instance that owns the bad route fails, saying which route and why.
    result = kw.run("restart", "other", "--json")
    assert result.code == 1
    error = result.json()["error"]
    assert error["code"] != "internal"
    assert "publish route for 'two.test\\n'" in error["message"]
    assert "not a valid hostname" in error["message"]
    latest = _ops(kw, "other")[0]
    assert latest["kind"] == "restart" and latest["state"] == "failed"
    assert "publish route for 'two.test\\n'" in str(latest["error"])
    assert _serves(kw, "two.test", "v1") and _serves(kw, "one.test", "v2")
    for app in ("hello", "other"):
        assert not any(CRASH in str(op["error"]) for op in _ops(kw, app))
    assert kw.ok("status", "--json").json()["leftovers"] == []


def test_an_exception_inside_an_operation_is_journaled_and_answered_as_what_it_is(
    kw: Keelway,
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    env_file = kw.home / "env" / "one.test.env"
    saved = env_file.read_bytes()
    env_file.unlink()
    env_file.mkdir()  # reading the instance key now raises inside the operation
    result = kw.run("restart", "hello", "--json")
    assert result.code == 1
    error = result.json()["error"]
    assert error["code"] != "internal" and "Is a directory" in error["message"]
    latest = _ops(kw, "hello")[0]
    assert latest["kind"] == "restart" and latest["state"] == "failed"
    assert str(latest["error"]).startswith("lay down: ")  # where, then what
    assert "Is a directory" in str(latest["error"])
    assert CRASH not in str(latest["error"])
    assert _serves(kw, "one.test", "v1")
    env_file.rmdir()
    env_file.write_bytes(saved)
    os.chmod(env_file, 0o600)
    kw.ok("restart", "hello")
    assert _serves(kw, "one.test", "v1")


def test_a_config_value_with_a_nul_or_over_the_limits_is_refused_and_changes_nothing(
    kw: Keelway,
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    before = kw.store_dump()
    pids = kw.app_pids()
    status, answer = _post(kw.home / "api.sock", "/v1/apps/hello/config",
                           {"set": {"GREETING": "s3cr3t\x00cut here"}})
    assert status == 400 and answer["error"]["code"] == "bad-request"
    message = answer["error"]["message"]
    assert "GREETING" in message and "NUL" in message and "s3cr3t" not in message
    # The CLI says the same for what argv can carry: a value over the size limit, a
    # name keelway sets itself.
    for pair, why in ((f"BIG={'x' * 40_000}", "over the limit"),
                      ("DATABASE_URL=sqlite:///elsewhere", "set by keelway itself")):
        result = kw.run("config", "hello", "set", pair, "--json")
        assert result.code == 1
        error = result.json()["error"]
        assert error["code"] == "bad-request" and why in error["message"]
    assert kw.store_dump() == before
    assert kw.app_pids() == pids
    assert _serves(kw, "one.test", "v1")
