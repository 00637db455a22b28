"""An alias is its instance in every route state, through the real CLI, daemon and router
(SPEC §1 domain / alias: it routes, wakes, holds and is certified exactly as the primary
host): a request by an alias is served, held through a hold-mode swap, wakes a parked
instance, gets the fence's page while fenced and the crash page while the web waits out
its backoff; its traffic counts as the instance's; a wake asked by the alias joins one
asked by the instance's own name."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from keelway.router.client import activity_sync, get_table_sync
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"
ALIAS = "www.one.test"
# Boots slowly (so a hold-mode swap holds requests for a while) unless its data dir has
# a `broken` marker, when it exits at boot (so a crash restart fails, into the backoff).
WEB = ("python3 -c \"import os, sys, time, runpy; "
       "os.path.exists(os.path.join(os.environ['KEELWAY_DATA_DIR'], 'broken')) "
       "and sys.exit(3); time.sleep(1.5); runpy.run_path('web.py', run_name='__main__')\"")


def _instance(kw: Keelway) -> dict[str, Any]:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == HOST:
                return dict(inst)
    raise AssertionError(f"no instance {HOST}")


def _route(kw: Keelway, host: str) -> tuple[str, str | None]:
    """The router's entry for `host`: its state, and the instance it names."""
    entry = get_table_sync(kw.home / "router" / "control.sock").routes[host]
    return entry.state.value, getattr(entry, "instance", None)


def _api_wake(kw: Keelway, host: str) -> int:
    """The router's wake (raw HTTP on the API socket): the status of the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(kw.home / "api.sock"))
        sock.sendall(f"POST /v1/instances/{host}/wake HTTP/1.1\r\nHost: keelway\r\n"
                     "Connection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: 2\r\n\r\n{}".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return int(reply.split()[1])


def _ops(kw: Keelway) -> list[dict[str, Any]]:
    return list(kw.ok("ops", "hello", "--json").json()["operations"])


def _web_spawns(kw: Keelway) -> int:
    return sum(1 for op in _ops(kw) for step in op["steps"] if step["name"] == "spawn web")


def test_every_route_state_reaches_its_instance_through_an_alias(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1", web_cmd=WEB, worker_mode="overlap")),
          "--host", HOST)
    kw.ok("domains", "add", HOST, ALIAS)

    # serving: the instance's own site, and its traffic counted as the instance's.
    assert _route(kw, ALIAS) == ("serving", HOST)
    time.sleep(1.2)
    status, body, _ = kw.get(ALIAS, "/")
    assert status == 200 and body.startswith(b"hello from one.test (v1)")
    seen = activity_sync(kw.home / "router" / "control.sock")
    assert ALIAS not in seen and seen[HOST].idle_s < 1.0, seen

    # holding: a hold-mode swap holds the alias's requests, then serves them by v2.
    deploying = threading.Thread(target=kw.ok, args=(
        "deploy", "hello", str(hello(tmp_path, "v2", web_cmd=WEB, web_mode="hold",
                                     worker_mode="overlap"))))
    deploying.start()
    try:
        assert wait_until(lambda: _route(kw, ALIAS)[0] == "holding", 30, 0.02)
        status, body, _ = kw.get(ALIAS, "/", timeout_s=30)
        assert status == 200 and body.startswith(b"hello from one.test (v2)"), body
    finally:
        deploying.join(60)

    # parked: a request by the alias wakes the instance (one wake) and is served.
    kw.ok("park", HOST)
    assert _route(kw, ALIAS) == ("parked", HOST)
    wakes_before = [o["kind"] for o in _ops(kw)].count("wake")
    status, body, _ = kw.get(ALIAS, "/", timeout_s=30)
    assert status == 200 and body.startswith(b"hello from one.test (v2)"), body
    assert [o["kind"] for o in _ops(kw)].count("wake") == wakes_before + 1
    assert _instance(kw)["state"] == "running"

    # gated by a fence: the alias's request is refused at once, with the fence's page.
    kw.ok("park", HOST)
    kw.ok("fence", HOST)
    began = time.monotonic()
    status, body, headers = kw.get(ALIAS, "/", timeout_s=30)
    assert status == 503 and b"maintenance" in body and "Retry-After" in headers, body
    assert time.monotonic() - began < 10  # not held for the 30 s hold bound
    assert _instance(kw)["state"] == "parked" and kw.app_pids() == []
    kw.ok("unfence", HOST)

    # crashed: the web cannot boot any more; once its quick retries are spent, the alias
    # says it is restarting, with the time left until the next retry.
    kw.ok("wake", HOST)
    (kw.home / "data" / HOST / "broken").touch()
    web = next(p for p in _instance(kw)["processes"]
               if p["service"] == "web" and p["active"])
    os.kill(int(web["pid"]), signal.SIGKILL)

    def slow_retry() -> bool:
        crashed = [c for c in _instance(kw)["crashed"] if c["service"] == "web"]
        return bool(crashed) and crashed[0]["retry_at"] - time.time() > 30

    assert wait_until(slow_retry, 40, 0.2), _instance(kw)
    assert wait_until(lambda: _route(kw, ALIAS)[0] == "crashed", 10)
    status, body, headers = kw.get(ALIAS, "/")
    assert status == 503 and b"restarting" in body, body
    assert 30 < int(headers["Retry-After"]) <= 60


def test_a_wake_by_an_alias_joins_a_concurrent_wake_by_the_instance_name(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1", worker_mode="overlap")),
          "--host", HOST)
    kw.ok("domains", "add", HOST, ALIAS)
    kw.ok("park", HOST)
    spawns = _web_spawns(kw)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda i: _api_wake(kw, ALIAS if i % 2 else HOST),
                                range(20)))
    assert answers == [202] * 20
    assert wait_until(lambda: _route(kw, ALIAS)[0] == "serving", 30)
    assert kw.get(ALIAS, "/health")[0] == 200 and kw.get(HOST, "/health")[0] == 200
    ops = _ops(kw)
    assert [o["kind"] for o in ops].count("wake") == 1
    assert _web_spawns(kw) == spawns + 1
    # And by hand: an operator's wake by the alias wakes the instance it names.
    kw.ok("park", HOST)
    woken = kw.ok("wake", ALIAS, "--json").json()
    assert woken["host"] == HOST and woken["woke"] is True
    assert json.loads(kw.get(ALIAS, "/info")[1])["instance"] == HOST
