"""Scale to zero at its edges, through the real CLI, daemon and router: a wake past the
hold bound, a control plane that dies while a request waits for a wake, and an open
WebSocket that keeps an instance awake against the idle sweep."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import websockets

from keelway.router.client import activity_sync
from tests.deploy.apps import SLOW_BOOT, hello
from tests.e2e.harness import EXAMPLE, Keelway, gone, wait_until
from tests.invariants import violations

pytestmark = pytest.mark.slow

HOST = "one.test"


def _state(kw: Keelway, host: str = HOST) -> str:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                return str(inst["state"])
    raise AssertionError(f"no instance {host}")


def test_a_wake_past_the_hold_bound_answers_503_and_leaves_nothing_behind(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up("--hold-timeout", "0.5")
    kw.ok("deploy", "hello", str(hello(tmp_path, "slow", web_cmd=SLOW_BOOT)), "--host", HOST)
    kw.ok("park", HOST)
    started = time.monotonic()
    status, _, headers = kw.get(HOST, "/health", timeout_s=30)
    assert status == 503 and "Retry-After" in headers
    assert time.monotonic() - started < 1.9  # answered at the bound, not at the boot
    # The wake it asked for goes on; once it is done, every process is one a record
    # names (nothing half-started is left), and the next request is served.
    assert wait_until(lambda: _state(kw) == "running" and kw.get(HOST, "/health")[0] == 200,
                      30)

    def woken() -> bool:
        ops = kw.ok("ops", "hello", "--json").json()["operations"]
        return bool(ops[0]["kind"] == "wake" and ops[0]["state"] == "succeeded")

    assert wait_until(woken, 30)
    assert violations(kw.home) == []


def test_a_request_to_a_parked_instance_is_answered_across_a_control_plane_crash(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("park", HOST)
    assert kw.daemon_pid is not None
    os.kill(kw.daemon_pid, signal.SIGKILL)
    assert gone(kw.daemon_pid, timeout_s=10)
    answer: list[int] = []
    waiting = threading.Thread(target=lambda: answer.append(kw.get(HOST, "/health",
                                                                   timeout_s=60)[0]))
    waiting.start()
    time.sleep(1)  # the router holds it and retries its wake against a dead socket
    assert not answer
    kw.up()  # back within the hold bound (30 s): the held request's wake now lands
    waiting.join(60)
    assert answer == [200]
    assert _state(kw) == "running"


def test_requests_held_for_a_wake_are_answered_across_a_kill_of_the_routers_main_process(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up("--router-workers", "2")
    boot_s = 4  # the wake is still going on when the router dies
    kw.ok("deploy", "hello", str(hello(tmp_path, "slow", web_cmd=SLOW_BOOT.replace(
        "time.sleep(2)", f"time.sleep({boot_s})"))), "--host", HOST)
    kw.ok("park", HOST)
    answers: list[tuple[int, str | None] | str] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            status, _, headers = kw.get(HOST, "/health", timeout_s=60)
            answer: tuple[int, str | None] | str = (status, headers.get("Retry-After"))
        except Exception as exc:  # an answer of none, recorded for the assertion
            answer = repr(exc)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for thread in threads:
        thread.start()

    def held() -> bool:
        seen = activity_sync(kw.home / "router" / "control.sock").get(HOST)
        return seen is not None and seen.open == 20

    assert wait_until(held, 10)
    router_pid = int((kw.home / "router" / "router.pid").read_text().split()[0])
    os.kill(router_pid, signal.SIGKILL)
    for thread in threads:
        thread.join(60)
    # Each got a whole answer: the app's once it is up, or 503 + Retry-After; none
    # had its connection closed with nothing.
    assert len(answers) == 20
    assert [a for a in answers if isinstance(a, str)
            or not (a[0] == 200 or (a[0] == 503 and a[1] is not None))] == []
    # The wake went on: the next router serves the instance.
    assert wait_until(lambda: _state(kw) == "running" and kw.get(HOST, "/health")[0] == 200,
                      30)

    def woken() -> bool:
        ops = kw.ok("ops", "hello", "--json").json()["operations"]
        return bool(ops[0]["kind"] == "wake" and ops[0]["state"] == "succeeded")

    assert wait_until(woken, 30)
    assert violations(kw.home) == []


WS_APP = '''\
import asyncio, os
import websockets

async def handler(ws):
    async for message in ws:
        await ws.send(message)

async def health(connection, request):
    if request.path == "/health":
        return connection.respond(200, "ok\\n")

async def main():
    async with websockets.serve(handler, "127.0.0.1", int(os.environ["PORT"]),
                                process_request=health):
        await asyncio.Future()

asyncio.run(main())
'''


def _ws_app(root: Path) -> Path:
    app = root / "ws"
    app.mkdir()
    (app / "ws.py").write_text(WS_APP)
    # The test's interpreter has `websockets`; the app runs on it.
    (app / "Procfile").write_text(f"web: {sys.executable} ws.py\n")
    (app / "keelway.toml").write_text('[services.web]\nhealth = "/health"\nsettle = "0.2s"\n'
                                      'idle = "1s"\npark_after = "0s"\n')
    return app


def test_an_open_websocket_keeps_its_instance_from_being_parked(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "ws", str(_ws_app(tmp_path)), "--host", HOST)
    opened = threading.Event()
    close = threading.Event()

    async def hold_open() -> None:
        # The URI names the instance (its Host header); the connection goes to loopback.
        async with websockets.connect(f"ws://{HOST}:{kw.http_port}/", host="127.0.0.1",
                                      port=kw.http_port, open_timeout=10) as ws:
            await ws.send("hi")
            assert await ws.recv() == "hi"
            opened.set()
            while not close.is_set():
                await asyncio.sleep(0.1)

    client = threading.Thread(target=lambda: asyncio.run(hold_open()))
    client.start()
    try:
        assert opened.wait(30)
        # Idle is 1 s and the sweep looks every 2 s: several sweeps pass meanwhile.
        time.sleep(6)
        assert _state(kw) == "running"
    finally:
        close.set()
        client.join(30)
    # Closed, the instance is idle again, and the sweep parks it.
    assert wait_until(lambda: _state(kw) == "parked", 20)
