"""`keelway logs` as a person uses it against a real daemon and router: the router's
access log of real requests (no query string), kept across a deploy, merged with the
services' lines of two instances in time order, and followed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = pytest.mark.slow


def _items(kw: Keelway, *args: str) -> list[dict[str, object]]:
    out = kw.ok("logs", "hello", "--json", *args).out
    return [json.loads(line) for line in out.splitlines()]


def test_logs_merge_the_access_log_and_services_of_two_instances_and_follow_new_lines(
        kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test", "--host", "two.test")
    for host in ("one.test", "two.test"):
        assert kw.get(host, "/?token=s3cret")[0] == 200

    def routed() -> list[dict[str, object]]:
        return _items(kw, "--service", "router")

    assert wait_until(lambda: len(routed()) == 2, timeout_s=20)
    assert {item["instance"] for item in routed()} == {"one.test", "two.test"}
    assert all(" GET / 200 " in str(item["line"]) and "s3cret" not in str(item["line"])
               for item in routed())

    # Survives a deploy: the file is the instance's, not a generation's.
    kw.ok("deploy", "hello", str(EXAMPLE))
    assert kw.get("one.test", "/after")[0] == 200
    assert wait_until(lambda: any(" /after " in str(i["line"]) for i in routed()),
                      timeout_s=20)
    assert len(routed()) == 3

    # Everything, in time order, from two instances and more than one service.
    every = _items(kw, "--since", "10m", "-n", "1000")
    assert [i["at"] for i in every] == sorted(i["at"] for i in every)  # type: ignore[type-var]
    assert {(i["instance"], i["service"]) for i in every} >= {
        ("one.test", "web"), ("two.test", "web"), ("one.test", "router"),
        ("two.test", "router")}
    assert len(_items(kw, "-n", "2")) == 2
    assert _items(kw, "--since", "2099-01-01T00:00") == []
    human = kw.ok("logs", "hello", "--service", "router", "--instance", "one.test").out
    assert human.splitlines()[0].startswith("one.test router | ")

    # Following picks up a new request's line within a bounded time.
    follower = subprocess.Popen(
        [sys.executable, "-m", "keelway.cli.main", "logs", "hello", "-f", "-n", "0",
         "--service", "router"], env=kw.env(), stdout=subprocess.PIPE, text=True)
    seen: list[str] = []
    assert follower.stdout is not None
    reader = threading.Thread(target=lambda: seen.extend(iter(follower.stdout.readline, "")))
    reader.start()
    try:
        time.sleep(1.0)
        assert kw.get("two.test", "/followed")[0] == 200
        assert wait_until(lambda: any("/followed" in line for line in seen), timeout_s=20)
        assert any(line.startswith("two.test router | ") for line in seen)
    finally:
        follower.terminate()
        follower.wait(10)
        reader.join(10)
        follower.stdout.close()
