"""Operations through the real CLI and daemon: fallback, one-shots, supersession, keys,
hold-mode exclusion and fail-closed (SPEC §4 Deployer and Reconciler)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from itertools import combinations
from pathlib import Path

import pytest

from keelway.runtime import process
from keelway.store import SqliteStore
from tests.deploy.apps import DIES_AFTER_READY, SLOW_BOOT, hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow


def _ops(kw: Keelway) -> list[dict[str, object]]:
    return kw.ok("ops", "hello", "--json").json()["operations"]  # type: ignore[no-any-return]


def test_an_overlap_release_that_fails_to_settle_falls_back_to_what_served(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "good", settle="2s")), "--host", "one.test")
    bad = hello(tmp_path, "bad", settle="2s", greeting="broken", web_cmd=DIES_AFTER_READY)
    result = kw.run("deploy", "hello", str(bad), "--mode", "overlap")
    assert result.code == 1 and "exited during the settle window" in result.err
    assert kw.get("one.test")[1].startswith(b"hello from one.test (v1)")
    assert _ops(kw)[0]["state"] == "failed"
    status = kw.ok("status", "--json").json()
    assert status["leftovers"] == []
    builds = {b["digest"][:12]: b["good"] for b in status["apps"][0]["builds"]}
    assert sorted(builds.values()) == [False, True]  # the failed build is never good


def test_a_failing_first_release_with_no_good_build_stops_and_says_so(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    bad = hello(tmp_path, "bad", settle="2s", web_cmd=DIES_AFTER_READY)
    result = kw.run("deploy", "hello", str(bad), "--host", "one.test", "--mode", "overlap")
    assert result.code == 1
    assert "no good build to fall back to" in result.err
    assert kw.get("one.test")[0] == 503
    assert kw.app_pids() == []


def test_a_hold_release_that_executed_and_failed_is_never_fallen_back(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "good", settle="2s")), "--host", "one.test")
    # The worker is hold-mode (the default for workers): once the new build's worker has
    # run, it may have migrated the database, so a failure must not bring v1 back.
    bad = hello(tmp_path, "bad", settle="2s", web_cmd=DIES_AFTER_READY)
    result = kw.run("deploy", "hello", str(bad))
    assert result.code == 1 and "stays down" in result.err
    assert kw.get("one.test")[0] == 503
    assert kw.app_pids() == []
    inst = kw.ok("status", "--json").json()["apps"][0]["instances"][0]
    assert (inst["state"], inst["desired"]) == ("failed", "down")
    assert "never fallen back" not in (inst["down_reason"] or "x")
    assert "failed after it executed" in inst["down_reason"]
    assert "stays down" in _ops(kw)[0]["error"]
    assert "is down" in kw.ok("status", "hello").out
    # Nothing restarts it behind the user's back, not even a control-plane restart.
    kw.ok("down")
    kw.up()
    assert kw.get("one.test")[0] == 503 and kw.app_pids() == []
    # A deliberate release brings it back.
    kw.ok("rollback", "hello", "v1")
    assert kw.get("one.test")[1].startswith(b"hello from one.test (v3)")  # v2 was the bad one


def test_a_clean_exit_inside_the_settle_window_is_a_one_shots_success(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    app = hello(tmp_path, "oneshot", settle="1s",
                worker_cmd="python3 -c 'print(\"migrated\")'")
    kw.ok("deploy", "hello", str(app), "--host", "one.test")
    time.sleep(1)
    ops = _ops(kw)
    assert ops[0]["state"] == "succeeded"
    events = kw.ok("events", "hello", "--json").json()["events"]
    assert [e for e in events if e["kind"] == "op" and "restart" in e["message"]] == []
    assert kw.get("one.test")[0] == 200


def test_a_superseded_attempt_never_marks_its_build_good_nor_writes_a_release(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", "one.test")
    slow = hello(tmp_path, "slow", greeting="slow", web_cmd=SLOW_BOOT)
    fast = hello(tmp_path, "fast", greeting="fast")
    outcome: dict[str, object] = {}
    first = threading.Thread(target=lambda: outcome.update(slow=kw.run("deploy", "hello",
                                                                       str(slow))))
    first.start()
    assert wait_until(lambda: any(o["state"] == "running" for o in _ops(kw)), 10)
    kw.ok("deploy", "hello", str(fast))
    first.join(60)
    slow_result = outcome["slow"]
    assert slow_result.code == 1 and "superseded" in slow_result.err  # type: ignore[attr-defined]
    assert kw.get("one.test")[1].startswith(b"fast")
    releases = kw.ok("releases", "hello", "--json").json()["releases"]
    assert [r["version"] for r in releases] == ["v2", "v1"]
    store = SqliteStore(kw.home / "keelway.db")
    try:
        slow_digest = next(b for b in store.builds.list_builds("hello")
                           if b.digest not in {r.build_digest for r in
                                               store.builds.list_releases("hello")})
        assert not slow_digest.good
    finally:
        store.close()


def test_a_key_replays_its_outcome_and_conflicts_with_another_request(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    app = hello(tmp_path, "app")
    first = kw.ok("deploy", "hello", str(app), "--host", "one.test", "--key", "k1",
                  "--json").json()
    again = kw.ok("deploy", "hello", str(app), "--host", "one.test", "--key", "k1",
                  "--json").json()
    assert again["replayed"] and again["build"] == first["build"]
    assert len(_ops(kw)) == 1
    other = kw.run("deploy", "hello", str(app), "--key", "k1", "--json")
    assert other.code == 1 and other.json()["error"]["code"] == "key-conflict"

    broken = hello(tmp_path, "broken", web_cmd="python3 -c 'raise SystemExit(2)'")
    failed = kw.run("deploy", "hello", str(broken), "--key", "k2", "--json")
    replay = kw.run("deploy", "hello", str(broken), "--key", "k2", "--json")
    assert failed.code == replay.code == 1
    assert replay.json()["error"] == failed.json()["error"]
    assert len(_ops(kw)) == 2  # the failed attempt ran once


def test_a_key_in_flight_is_a_conflict(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", "one.test")
    slow = hello(tmp_path, "slow", web_cmd=SLOW_BOOT)
    thread = threading.Thread(target=lambda: kw.run("deploy", "hello", str(slow), "--key", "k"))
    thread.start()
    assert wait_until(lambda: any(o["state"] == "running" for o in _ops(kw)), 10)
    during = kw.run("deploy", "hello", str(slow), "--key", "k", "--json")
    thread.join(60)
    assert during.code == 1 and during.json()["error"]["code"] == "key-in-flight"


def test_hold_mode_never_runs_two_generations_at_once(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    app = hello(tmp_path, "app", web_mode="hold")
    kw.ok("deploy", "hello", str(app), "--host", "one.test")
    kw.ok("restart", "hello")
    kw.ok("deploy", "hello", str(hello(tmp_path, "b", greeting="b", web_mode="hold")))
    kw.ok("config", "hello", "set", "A=1")
    store = SqliteStore(kw.home / "keelway.db")
    try:
        for service in ("web", "worker"):
            gens = [g for g in store.generations.recent_generations("one.test",
                                                                    50) if g.service == service]
            assert len(gens) == 4
            # [journaled before the spawn, proven gone]: wider than each real lifetime, so
            # disjoint intervals prove the processes never overlapped.
            spans = [(g.created_at, g.exited_at or float("inf")) for g in gens]
            for (a_start, a_end), (b_start, b_end) in combinations(spans, 2):
                assert a_end <= b_start or b_end <= a_start, (service, spans)
    finally:
        store.close()


def test_a_candidate_that_cannot_be_removed_fails_the_instance_closed(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", "one.test")
    # Kill the control plane once the next deploy's web candidate is ready but not yet
    # published; the apps survive, as they do any crash.
    kw.started_pids.extend(kw.app_pids())
    kw.ok("down", "--keep-apps")
    os.environ["KEELWAY_FAILPOINTS"] = "ready.after"
    try:
        kw.up()
    finally:
        del os.environ["KEELWAY_FAILPOINTS"]
    kw.run("deploy", "hello", str(hello(tmp_path, "v2", greeting="v2")))
    assert wait_until(lambda: process.read_stat(kw.daemon_pid or 0) is None
                      or process.read_stat(kw.daemon_pid or 0).state == "Z")  # type: ignore[union-attr]
    # The candidate: the newest web generation (its number depends on what else runs,
    # the replicator among them).
    store = SqliteStore(kw.home / "keelway.db")
    candidate = max(g.id for g in store.generations.recent_generations("one.test", limit=100)
                    if g.service == "web")
    store.close()
    kw.unkillable = frozenset({candidate})
    try:
        kw.up()
    finally:
        kw.unkillable = frozenset()
    refused = kw.run("restart", "hello", "--json")
    assert refused.code == 1
    error = refused.json()["error"]
    assert "failed closed" in error["message"] and f"generation {candidate}" in error["message"]
    inst = kw.ok("status", "--json").json()["apps"][0]["instances"][0]
    assert inst["failed_closed"]["leftovers"] == [f"web generation {candidate}"]
    assert kw.get("one.test")[1].startswith(b"hello from")  # the old one still serves

    store = SqliteStore(kw.home / "keelway.db")
    leftover = store.local.presence(candidate) if store.generations.get_generation(
        candidate) else None
    store.close()
    assert leftover is not None and leftover.pid is not None
    os.kill(leftover.pid, signal.SIGKILL)
    kw.ok("restart", "hello")
    assert kw.ok("status", "--json").json()["apps"][0]["instances"][0]["failed_closed"] is None
    assert json.loads(kw.get("one.test", "/info")[1])["release"] == "v1"
