"""A person starts keelway, deploys hello to two hostnames, and drives it with the CLI."""

from __future__ import annotations

import json

import pytest

from keelway.builds.manifest import REPLICA
from keelway.runtime import process
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = pytest.mark.slow


def test_deploy_to_two_hostnames_serves_both_and_the_cli_sees_everything(kw: Keelway) -> None:
    kw.up()
    deployed = kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test",
                     "--host", "two.test", "--json").json()
    assert [i["host"] for i in deployed["instances"]] == ["one.test", "two.test"]
    assert all(i["url"] == f"http://{i['host']}:{kw.http_port}/" for i in deployed["instances"])

    for host in ("one.test", "two.test"):
        status, body, _ = kw.get(host)
        assert status == 200
        assert body.decode().startswith(f"hello from {host} (v1)")
    # The worker writes heartbeats into the same instance database the web reads.
    assert wait_until(lambda: json.loads(kw.get("one.test", "/info")[1])["beats"] > 0)

    status_json = kw.ok("status", "--json").json()
    (app,) = status_json["apps"]
    assert app["name"] == "hello" and app["release"] == "v1"
    for inst in app["instances"]:
        # The replicator is keelway's, named by its own record, not by ACTIVE.
        services = {p["service"]: p for p in inst["processes"] if p["service"] != REPLICA}
        assert set(services) == {"web", "worker"}
        assert [p["active"] for p in inst["processes"] if p["service"] == REPLICA] == (
            [False] if kw.replicate else [])
        for proc in services.values():
            assert proc["active"] and proc["pid"]
            assert process.read_stat(proc["pid"]) is not None
        assert services["web"]["port"]
    assert status_json["leftovers"] == []

    logs = [json.loads(line) for line in kw.ok("logs", "hello", "--json").out.splitlines()]
    seen = {(item["instance"], item["service"]) for item in logs}
    assert {("one.test", "web"), ("two.test", "web"), ("one.test", "worker")} <= seen
    assert any("web listening" in item["line"] for item in logs)

    human = kw.ok("status", "hello").out
    assert "one.test" in human and "two.test" in human
    events = kw.ok("events", "hello", "--json").json()["events"]
    assert any("deploy succeeded" in e["message"] for e in events)

    # Stop one instance: its processes are proven gone and its host answers 503 "stopped".
    one_pids = [(p["pid"]) for p in app["instances"][0]["processes"]]
    kw.ok("stop", "hello", "--instance", "one.test")
    assert all(process.read_stat(pid) is None or process.read_stat(pid).state == "Z"
               for pid in one_pids)
    # The page says it is stopped, with no Retry-After: it comes back by `start` alone.
    status, body, headers = kw.get("one.test")
    assert (status, body) == (503, b"503 Service Unavailable\n\nThe site is stopped.\n")
    assert "Retry-After" not in headers
    assert kw.get("two.test")[0] == 200

    kw.ok("start", "hello", "--instance", "one.test")
    status, body, _ = kw.get("one.test")
    assert status == 200 and b"hello from one.test" in body

    pids = kw.app_pids()
    kw.ok("down")
    assert wait_until(lambda: not any(process.is_alive(p, t) for p, t in pids), 10)


def test_an_unknown_host_gets_a_404_that_names_no_internals(kw: Keelway) -> None:
    kw.up()
    status, body, headers = kw.get("nobody.test")
    assert status == 404
    for word in (b"keelway", b"python", b"Traceback", str(kw.home).encode()):
        assert word not in body
    assert "keelway" not in json.dumps(headers).lower()


def test_the_demo_is_served_at_demo_localhost(kw: Keelway) -> None:
    kw.up("--demo")
    status, body, _ = kw.get("demo.localhost")
    assert status == 200 and body.startswith(b"hello from demo.localhost")
    # A second `up --demo` after `down` reuses the staged build and keeps release v1.
    kw.ok("down")
    kw.up("--demo")
    assert kw.get("demo.localhost")[0] == 200
    releases = kw.ok("releases", "demo", "--json").json()["releases"]
    assert [r["version"] for r in releases] == ["v1"]


def test_the_cli_says_how_to_start_keelway_when_it_is_not_running(kw: Keelway) -> None:
    result = kw.run("status")
    assert result.code == 1
    assert "not running" in result.err and "keelway up -d" in result.err
    assert "Traceback" not in result.err
    as_json = kw.run("status", "--json")
    assert as_json.code == 1 and as_json.json()["error"]["code"] == "not-running"


def test_x_forwarded_for_is_kept_only_from_a_trusted_front_proxy(kw: Keelway) -> None:
    def forwarded_for() -> str:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", kw.http_port, timeout=10)
        conn.request("GET", "/info", headers={"Host": "one.test",
                                               "X-Forwarded-For": "203.0.113.9"})
        body = json.loads(conn.getresponse().read())
        conn.close()
        return str(body["headers"]["x-forwarded-for"])

    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    # Several connections: each may land on another router worker.
    assert {forwarded_for() for _ in range(6)} == {"127.0.0.1"}
    kw.ok("down")
    kw.up("--trusted-proxy", "127.0.0.1")
    assert {forwarded_for() for _ in range(6)} == {"203.0.113.9, 127.0.0.1"}
