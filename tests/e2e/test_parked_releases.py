"""Releases to parked instances: a deploy, config change or rollback leaves a parked
instance parked, and its next wake runs the release as an attempt (settle window and
fallback by cause and mode), through the real CLI, daemon and router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy.apps import DIES_AFTER_READY, hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"


def _instance(kw: Keelway, host: str) -> dict[str, object]:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                return dict(inst)
    raise AssertionError(f"no instance {host}")


def _release_served(kw: Keelway, host: str) -> str:
    status, body, _ = kw.get(host, "/info", timeout_s=30)
    assert status == 200, body
    return str(json.loads(body)["release"])


def test_a_deploy_leaves_a_parked_instance_parked_and_its_wake_serves_the_new_release(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    kw.ok("park", HOST)
    deployed = kw.ok("deploy", "hello", str(hello(tmp_path, "b", greeting="hi")),
                     "--json").json()
    assert [(i["host"], i["outcome"]) for i in deployed["instances"]] == [(HOST, "deferred")]
    assert kw.app_pids() == []  # nothing started
    assert _instance(kw, HOST)["state"] == "parked"
    assert [r["version"] for r in kw.ok("releases", "hello", "--json").json()["releases"]][
        :1] == ["v2"]
    # A config change on top: still parked, still one release to run at the wake.
    kw.ok("config", "hello", "set", "GREETING=hey")
    assert kw.app_pids() == [] and _instance(kw, HOST)["state"] == "parked"

    # The first request wakes it onto the newest release, held meanwhile.
    assert _release_served(kw, HOST) == "v3"
    assert _instance(kw, HOST)["state"] == "running"
    # Served once published; the wake's operation ends after its settle window.
    def woke() -> bool:
        ops = kw.ok("ops", "hello", "--json").json()["operations"]
        return bool(ops[0]["kind"] == "wake" and ops[0]["state"] == "succeeded")

    assert wait_until(woke, 10)


def test_a_wake_onto_a_failing_overlap_release_falls_back_to_the_good_build(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a", worker_mode="overlap")), "--host", HOST)
    kw.ok("park", HOST)
    kw.ok("deploy", "hello", str(hello(tmp_path, "bad", web_cmd=DIES_AFTER_READY,
                                       settle="1.5s", worker_mode="overlap")))
    woke = kw.run("wake", HOST, "--json")
    assert woke.code != 0, woke.out
    # Back on v1, serving, and the failed release is not tried again by the next wake.
    assert _release_served(kw, HOST) == "v1"
    assert _instance(kw, HOST)["state"] == "running"
    kw.ok("park", HOST)
    kw.ok("wake", HOST)
    assert _release_served(kw, HOST) == "v1"


def test_a_wake_onto_a_failing_hold_release_that_executed_stays_down(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a", web_mode="hold")), "--host", HOST)
    kw.ok("park", HOST)
    kw.ok("deploy", "hello", str(hello(tmp_path, "bad", web_cmd=DIES_AFTER_READY,
                                       settle="1.5s", web_mode="hold")))
    assert kw.run("wake", HOST).code != 0
    inst = _instance(kw, HOST)
    assert (inst["state"], inst["desired"]) == ("failed", "down"), inst
    assert kw.app_pids() == []
    status, _, headers = kw.get(HOST, "/health", timeout_s=30)
    assert status == 503 and "Retry-After" in headers


def test_instances_added_parked_run_nothing_until_their_first_request(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    running = kw.app_pids()
    added = kw.ok("instances", "add", "hello", "two.test", "three.test", "--parked",
                  "--json").json()
    assert added["started"] == []
    assert kw.app_pids() == running
    assert _instance(kw, "two.test")["state"] == "parked"
    assert _release_served(kw, "two.test") == "v1"
    assert wait_until(lambda: _instance(kw, "two.test")["state"] == "running", 10)
    assert _instance(kw, "three.test")["state"] == "parked"


def test_run_on_a_parked_instance_uses_the_release_its_next_wake_serves(
        kw: Keelway, tmp_path: Path) -> None:
    """`run -- manage.py migrate` after a deploy must run the new code with the new
    config, even while the instance sleeps on the old release."""
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    kw.ok("config", "hello", "--instance", HOST, "set", "SHELF=mine")
    kw.ok("park", HOST)
    kw.ok("deploy", "hello", str(hello(tmp_path, "b", greeting="hi")))
    kw.ok("config", "hello", "set", "GREETING=hey")
    newest = kw.ok("releases", "hello", "--json").json()["releases"][0]["version"]
    ran = kw.ok("run", "hello", "--", "sh", "-c",
                'echo "$KEELWAY_RELEASE $GREETING $SHELF"; grep -c "f.hi {INSTANCE}" web.py')
    assert ran.out.splitlines() == [f"{newest} hey mine", "1"], ran.out
    # The run wakes nothing: the instance sleeps on, its release still to run at the wake.
    assert kw.app_pids() == [] and _instance(kw, HOST)["state"] == "parked"
    assert _release_served(kw, HOST) == newest


def test_a_rollout_defers_its_parked_cohort_in_bulk_each_instance_journaled_alone(
        kw: Keelway, tmp_path: Path) -> None:
    """After the awake instance wrote the release, the parked ones take it in one write
    (keelway/deploy/deployer.py `_defer_parked`): each still has its own operation with
    its DEFER step, as its own attempt would have written, and its wake serves it."""
    kw.up()
    parked = ["p1.test", "p2.test", "p3.test"]
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST,
          *(a for h in parked for a in ("--host", h)))
    for host in parked:
        kw.ok("park", host)
    changed = kw.ok("config", "hello", "set", "GREETING=hey", "--json").json()
    assert sorted((i["host"], i["outcome"]) for i in changed["instances"]) == [
        (HOST, "done"), *((h, "deferred") for h in parked)]
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    for host in parked:
        mine = [op for op in ops if op["instance"] == host]
        assert mine[0]["kind"] == "config" and mine[0]["state"] == "succeeded", mine[0]
        assert [(s["name"], s["state"], s["detail"]) for s in mine[0]["steps"]] == [
            ("deferred to the next wake", "succeeded", "v2")], mine[0]
        assert _instance(kw, host)["pending_release"] == "v2"
    rollout = kw.ok("rollout", "status", "hello", "--json").json()["rollout"]
    assert rollout["state"] == "done"
    assert _release_served(kw, "p2.test") == "v2"
