"""Scale to zero by hand and by the idle sweep, and fences, through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from keelway.router.client import get_table_sync
from keelway.runtime import process
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"


def _instance(kw: Keelway, host: str) -> dict[str, object]:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                return dict(inst)
    raise AssertionError(f"no instance {host}")


def _api(kw: Keelway, path: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    """POST to the API as the router does (raw HTTP on the unix socket): status, JSON."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(kw.home / "api.sock"))
        payload = json.dumps(body).encode()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: keelway\r\nConnection: close\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(payload)}"
                     "\r\n\r\n".encode() + payload)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, text = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(text)


def _router_state(kw: Keelway, host: str) -> tuple[str, str | None]:
    entry = get_table_sync(kw.home / "router" / "control.sock").routes[host]
    return entry.state.value, entry.upstream


def test_a_parked_instance_runs_nothing_and_a_wake_by_hand_serves_again(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    running = kw.app_pids()
    assert len(running) == 2  # web and worker

    parked = kw.ok("park", HOST, "--json").json()
    assert parked["parked"] and len(parked["stopped"]) == 2
    assert not any(process.is_alive(pid, ticks) for pid, ticks in running)
    inst = _instance(kw, HOST)
    assert inst["state"] == "parked" and inst["route"] == {"state": "parked", "port": None}
    # An older router holds nothing and answers it as `holding`; never an upstream.
    assert _router_state(kw, HOST) in (("parked", None), ("holding", None))
    assert kw.ok("park", HOST, "--json").json()["parked"] is False

    woken = kw.ok("wake", HOST, "--json").json()
    assert woken["woke"] is True and set(woken["generations"]) == {"web", "worker"}
    assert kw.get(HOST, "/health")[0] == 200
    assert _router_state(kw, HOST)[0] == "serving"
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert [(o["kind"], o["state"]) for o in ops[:2]] == [("wake", "succeeded"),
                                                          ("park", "succeeded")]


def test_a_fenced_instance_refuses_a_wake_until_its_own_fence_is_lifted(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    before = kw.store_dump()
    for path, body, code in [("/v1/instances/Bad_Host/fence", {}, 400),
                             ("/v1/instances/nobody.test/fence", {}, 404),
                             (f"/v1/instances/{HOST}/fence", {"bogus": 1}, 400),
                             (f"/v1/instances/{HOST}/fence", {"reason": "a\nb"}, 400),
                             (f"/v1/instances/{HOST}/unfence", {"generation": "x"}, 400),
                             ("/v1/instances/nobody.test/park", {}, 404),
                             ("/v1/instances/nobody.test/wake", {}, 404)]:
        status, answer = _api(kw, path, body)
        assert status == code and "message" in answer["error"], (path, answer)  # type: ignore[operator]
    assert kw.store_dump() == before  # bad input changed nothing
    kw.ok("park", HOST)
    assert kw.ok("fence", HOST, "--reason", "seed import", "--json").json() == {
        "host": HOST, "generation": 1, "held": True, "reason": "seed import"}

    refused = kw.run("wake", HOST, "--json")
    assert refused.code != 0 and refused.json()["error"]["code"] == "fenced"
    status, answer = _api(kw, f"/v1/instances/{HOST}/wake", {})  # the router's: at once
    assert status == 409 and answer["error"]["code"] == "fenced"  # type: ignore[index]
    started = kw.run("start", "hello", "--json")
    assert started.code != 0 and started.json()["error"]["code"] == "fenced"
    assert kw.app_pids() == [] and _instance(kw, HOST)["state"] == "parked"

    # A holder whose fence was superseded lifts nothing.
    assert kw.ok("fence", HOST, "--json").json()["generation"] == 2
    stale = _api(kw, f"/v1/instances/{HOST}/unfence", {"generation": 1})
    assert stale == (200, {"host": HOST, "generation": 2, "held": True, "reason": None,
                     "lifted": False})
    assert kw.run("wake", HOST).code != 0

    assert kw.ok("unfence", HOST, "--json").json()["lifted"] is True
    assert kw.ok("wake", HOST, "--json").json()["woke"] is True
    assert kw.get(HOST, "/health")[0] == 200
    assert _instance(kw, HOST)["fence"] == {"generation": 2, "held": False, "reason": None}


def _idle_app(root: Path) -> Path:
    app = root / "idle-app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "keelway.toml").write_text(
        '[services.web]\nhealth = "/health"\nsettle = "0.2s"\nidle = "1s"\n'
        '[services.worker]\nsettle = "0.2s"\nidle = "1s"\npark_after = "0s"\n')
    return app


def _router_reports_activity(kw: Keelway) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(kw.home / "router" / "control.sock"))
        sock.sendall(b'{"op":"activity"}\n')
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return bool(json.loads(reply).get("ok"))


def test_the_sweep_never_parks_an_instance_whose_app_declares_no_idle(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "plain", str(EXAMPLE), "--host", "plain.test")
    kw.ok("deploy", "sleepy", str(_idle_app(tmp_path)), "--host", "sleepy.test")
    if _router_reports_activity(kw):
        assert wait_until(lambda: _instance(kw, "sleepy.test")["state"] == "parked", 20)
    else:  # a router without the activity op: the sweep parks nothing
        time.sleep(6)  # three sweeps past the 1 s idle
        assert _instance(kw, "sleepy.test")["state"] == "running"
    time.sleep(3)
    assert _instance(kw, "plain.test")["state"] == "running"
    assert kw.get("plain.test", "/health")[0] == 200


def test_many_wakes_at_once_are_answered_at_once_and_make_one_wake(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("park", HOST)
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: _api(kw, f"/v1/instances/{HOST}/wake", {}),
                                range(20)))
    assert answers == [(202, {"host": HOST, "accepted": True})] * 20
    assert wait_until(lambda: _router_state(kw, HOST)[0] == "serving", 30)
    assert kw.get(HOST, "/health")[0] == 200
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert [o["kind"] for o in ops].count("wake") == 1
    spawned = [s for s in ops[0]["steps"] if s["name"] == "spawn web"]
    assert ops[0]["kind"] == "wake" and len(spawned) == 1


def _web(kw: Keelway) -> dict[str, object]:
    procs = _instance(kw, HOST)["processes"]
    return next(p for p in procs if p["service"] == "web" and p["active"])  # type: ignore[attr-defined]


def test_a_crashed_process_of_a_fenced_instance_is_restarted_only_once_unfenced(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    crashed = _web(kw)
    kw.ok("fence", HOST)
    os.kill(int(str(crashed["pid"])), signal.SIGKILL)
    assert wait_until(lambda: _web(kw)["state"] == "gone", 10)
    time.sleep(3)  # past the first quick retries of the backoff
    assert _web(kw)["id"] == crashed["id"] and kw.get(HOST, "/health")[0] == 503
    kw.ok("unfence", HOST)
    assert wait_until(lambda: _web(kw)["id"] != crashed["id"]
                      and _web(kw)["state"] == "ready", 20)
    assert kw.get(HOST, "/health")[0] == 200


def test_fifty_requests_to_a_parked_instance_all_get_200_from_one_spawn_of_web(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("park", HOST)
    with ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(lambda _: kw.get(HOST, "/health", timeout_s=30)[0],
                                 range(50)))
    assert statuses == [200] * 50
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    wakes = [o for o in ops if o["kind"] == "wake"]
    assert len(wakes) == 1 and wakes[0]["state"] == "succeeded"
    assert [s["name"] for s in ops[0]["steps"]].count("spawn web") == 1


def test_a_fenced_parked_instance_answers_503_and_stays_parked(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("park", HOST)
    kw.ok("fence", HOST)
    status, _, headers = kw.get(HOST, "/health", timeout_s=30)
    assert status == 503 and "Retry-After" in headers
    assert _instance(kw, HOST)["state"] == "parked" and kw.app_pids() == []
