"""The frozen tier through the real CLI, daemon and router (issue #22,
keelway/deploy/freezing.py): a frozen instance's processes answer nothing until a
request thaws it (by its host or an alias); a deploy, a config change, a restore and a
`run` on a frozen instance behave as on an awake one; a frozen instance stays frozen
through a control-plane SIGKILL and thaws on its next request; the idle sweep freezes,
then parks after `park_after`; the frozen budget parks what does not fit."""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import pytest

from tests.deploy.apps import hello
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HOST = "one.test"
ALIAS = "www.one.test"


def _instance(kw: Keelway, host: str) -> dict[str, object]:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                return dict(inst)
    raise AssertionError(f"no instance {host}")


def _route(kw: Keelway, host: str) -> str:
    route = _instance(kw, host)["route"]
    assert isinstance(route, dict)
    return str(route["state"])


def _answers_directly(port: int, timeout_s: float = 0.5) -> bool:
    """Whether the web answers on its own port within `timeout_s` (a frozen one does
    not: its process cannot run)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.")
    except OSError:
        return False


def _web_port(kw: Keelway) -> int:
    route = _instance(kw, HOST)["route"]
    assert isinstance(route, dict)
    return int(route["port"])


def _thawed_by_a_request(kw: Keelway, name: str) -> None:
    port = _web_port(kw)
    kw.ok("freeze", name if name == HOST else HOST)
    assert _route(kw, HOST) == "frozen"
    assert not _answers_directly(port)
    started = time.monotonic()
    assert kw.get(name, "/health")[0] == 200
    print(f"thawed by a request to {name} in {1000 * (time.monotonic() - started):.1f} ms")
    assert _route(kw, HOST) == "serving" and _answers_directly(port)


def test_a_frozen_instance_thaws_on_a_request_and_acts_as_an_awake_one(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    kw.ok("domains", "add", HOST, ALIAS)
    _thawed_by_a_request(kw, HOST)
    _thawed_by_a_request(kw, ALIAS)
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert ops[0]["kind"] == "wake" and [s["name"] for s in ops[0]["steps"]][:2] == [
        "thaw", "route served"]
    assert "frozen already" in kw.ok("freeze", HOST, "--dry-run").out or (
        "freeze" in kw.ok("freeze", HOST, "--dry-run").out)

    # A deploy on a frozen instance: the new release serves.
    kw.ok("freeze", HOST)
    kw.ok("deploy", "hello", str(hello(tmp_path, "v2")))
    assert b"v2" in kw.get(HOST, "/")[1]
    # A config change on a frozen instance.
    kw.ok("freeze", HOST)
    kw.ok("config", "hello", "set", "GREETING=hi")
    assert kw.get(HOST, "/health")[0] == 200 and _route(kw, HOST) == "serving"
    # A one-off run beside a frozen instance.
    kw.ok("freeze", HOST)
    assert kw.run("run", "hello", "--", "sh", "-c", "echo ran").out.strip().endswith("ran")
    assert _route(kw, HOST) == "frozen"
    # A restore of a frozen instance's database.
    snapshot = kw.ok("db", "snapshot", HOST, "--json").json()
    kw.ok("freeze", HOST)
    kw.ok("db", "restore", HOST, str(snapshot["id"]))
    assert kw.get(HOST, "/health")[0] == 200

    # A control-plane SIGKILL while frozen: frozen after the next boot, thawed by a request.
    kw.ok("freeze", HOST)
    port = _web_port(kw)
    kw.kill_daemon()
    kw.up()
    assert _route(kw, HOST) == "frozen" and not _answers_directly(port)
    assert kw.get(HOST, "/health")[0] == 200 and _answers_directly(port)

    # Bad input changes nothing.
    assert kw.run("freeze", "nobody.test").code != 0
    kw.ok("park", HOST)
    refused = kw.run("freeze", HOST)
    assert refused.code != 0 and "parked" in refused.err


def _idle_app(root: Path, park_after: str) -> Path:
    app = root / f"idle-{park_after}"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "keelway.toml").write_text(
        f'[services.web]\nhealth = "/health"\nsettle = "0.2s"\nidle = "1s"\n'
        f'park_after = "{park_after}"\n'
        '[services.worker]\nsettle = "0.2s"\nidle = "1s"\n')
    return app


def test_the_sweep_freezes_then_parks_and_the_budget_parks_what_does_not_fit(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "sleepy", str(_idle_app(tmp_path, "4s")), "--host", HOST)
    assert wait_until(lambda: _route(kw, HOST) == "frozen", 20)
    assert _instance(kw, HOST)["state"] == "frozen"
    assert wait_until(lambda: _instance(kw, HOST)["state"] == "parked", 20)
    assert kw.get(HOST, "/health")[0] == 200  # a parked one wakes as before

    # Over the frozen budget (two instances of ~15 MB each, 16M allowed): the one frozen
    # longest is parked, the other stays frozen.
    kw.ok("park", HOST)
    kw.ok("down", "--keep-apps")
    kw.up("--frozen-budget", "16M")
    kw.ok("deploy", "dozy", str(_idle_app(tmp_path, "1h")), "--host", "a.test", "--host",
          "b.test")

    def states() -> set[str]:
        return {_instance(kw, h)["state"] for h in ("a.test", "b.test")}  # type: ignore[misc]

    assert wait_until(lambda: "parked" in states(), 30)
    time.sleep(2.5)  # one more sweep: the other fits, and stays frozen
    ops = kw.ok("ops", "dozy", "--json").json()["operations"]
    froze = [o["instance"] for o in sorted(ops, key=lambda o: o["id"]) if o["kind"] == "freeze"]
    first, second = froze[0], froze[1]
    assert _instance(kw, first)["state"] == "parked" and _route(kw, second) == "frozen"
    assert "frozen instances keep" in (kw.home / "logs" / "keelway.log").read_text()
