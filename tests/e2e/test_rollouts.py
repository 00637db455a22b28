"""Rollouts across twenty instances, through the real CLI and a real daemon and router
(issue #19): a good release reaches all; a broken one halts at its canary with the other
nineteen untouched and serving; one whose 5xx rate breaks the budget during its bake
halts with the figures in `rollout status`, and `abort` takes it back; a quiet canary
follows `on_no_traffic`; a newer release supersedes a rollout under way."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import EXAMPLE, Keelway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOSTS = [f"t{i:02}.shop.test" for i in range(20)]
PROCFILE = "web: python3 web.py\n"


def _app(root: Path, name: str, rollout: str = "", web: str | None = None) -> Path:
    """hello with its web alone (20 instances, 20 processes), a quick settle, and
    `rollout` as its [rollout] table; `web` replaces web.py's answer to `/`."""
    app = root / name
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "Procfile").write_text(PROCFILE)
    (app / "keelway.toml").write_text(
        '[services.web]\nhealth = "/health"\nsettle = "0.3s"\nstop_grace = "2s"\n'
        + (f"[rollout]\n{rollout}" if rollout else ""))
    if web is not None:
        source = (app / "web.py").read_text()
        answer = 'self.reply(200, "text/plain; charset=utf-8", text.encode())'
        assert answer in source
        (app / "web.py").write_text(source.replace(answer, web))
    return app


def _deployed(kw: Keelway, app: Path) -> None:
    kw.replicate = False  # twenty replicators are not what these tests are about
    kw.up()
    hosts = [arg for host in HOSTS for arg in ("--host", host)]
    kw.ok("deploy", "shop", str(app), *hosts, timeout_s=240)


def _releases(kw: Keelway) -> dict[str, str]:
    """What each instance answers at `/`, by host: its release, or its status."""
    def one(host: str) -> tuple[str, str]:
        status, body, _ = kw.get(host, "/")
        if status != 200:
            return host, str(status)
        return host, body.decode().split("(")[1].split(")")[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, HOSTS))


def _status(kw: Keelway) -> dict[str, Any]:
    rollout: dict[str, Any] = kw.ok("rollout", "status", "shop", "--json").json()["rollout"]
    return rollout


def test_a_good_release_reaches_all_twenty_in_cohorts(kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    began = time.monotonic()
    kw.ok("config", "shop", "set", "GREETING=hi", timeout_s=240)
    took = time.monotonic() - began
    assert set(_releases(kw).values()) == {"v2"}
    rollout = _status(kw)
    assert (rollout["release"], rollout["kind"], rollout["state"]) == ("v2", "config", "done")
    assert [i["cohort"] for i in rollout["instances"]] == [1, 2] + [3] * 8 + [4] * 10
    assert {i["state"] for i in rollout["instances"]} == {"rolled"}
    # Each cohort's settle windows ran beside each other: four cohorts, not twenty
    # instances one after another (20 x 0.3 s of settle alone, and each one's start).
    print(f"config across 20 instances: {took:.1f} s")
    shown = kw.ok("rollout", "status", "shop").out
    assert "shop v2 (config): done, cohort 4 of 4" in shown


def test_a_release_that_fails_its_canary_halts_with_the_other_nineteen_untouched(
        kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    broken = _app(tmp_path, "broken")
    (broken / "Procfile").write_text("web: python3 -c 'raise SystemExit(3)'\n")
    failed = kw.run("deploy", "shop", str(broken), timeout_s=240)
    assert failed.code == 1 and "the rollout is halted" in failed.err, failed.err
    assert "keelway rollout status shop" in failed.err
    rollout = _status(kw)
    assert rollout["state"] == "halted" and rollout["cohort"] == 1
    assert rollout["reason"].startswith(f"{HOSTS[0]}: ")
    assert [i["state"] for i in rollout["instances"]] == ["failed"] + ["pending"] * 19
    shown = kw.ok("status", "shop").out  # a halted rollout is shown where the fleet is
    assert "rollout of v2: halted at cohort 1 of 4" in shown
    assert kw.ok("status", "--json").json()["apps"][0]["rollout"]["state"] == "halted"
    # The canary fell back to v1 (overlap mode); the nineteen never left it.
    assert set(_releases(kw).values()) == {"v1"}


def test_a_cohort_over_its_5xx_budget_halts_with_its_figures_and_abort_takes_it_back(
        kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    bad = _app(tmp_path, "bad", 'bake = "2s"\nmax_5xx = "1%"\n',
               web='self.reply(500, "text/plain; charset=utf-8", b"broken\\n")')
    stop = threading.Event()
    answers: list[int] = []

    def traffic() -> None:  # steady requests to the canary, as its users would send
        while not stop.is_set():
            answers.append(kw.get(HOSTS[0], "/")[0])
            time.sleep(0.02)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        failed = kw.run("deploy", "shop", str(bad), timeout_s=240)
    finally:
        stop.set()
        sender.join()
    assert failed.code == 1 and "over the budget of 1%" in failed.err, failed.err
    rollout = _status(kw)
    assert (rollout["state"], rollout["cohort"]) == ("halted", 1)
    figures = rollout["figures"]
    assert figures["verdict"] == "failed" and figures["errors"] > 0
    assert figures["by_host"][0]["host"] == HOSTS[0]
    assert figures["errors"] * 100 > figures["responses"]
    shown = kw.ok("rollout", "status", "shop").out
    assert "cohort 1 judged:" in shown and "over the budget of 1%" in shown
    assert 500 in answers  # the canary served the bad release to its users...
    releases = _releases(kw)
    assert releases[HOSTS[0]] == "500" and set(releases[h] for h in HOSTS[1:]) == {"v1"}
    # ...until the abort takes every rolled instance back to the release before.
    aborted = kw.ok("rollout", "abort", "shop", "--json", timeout_s=120).json()
    assert aborted["rollout"]["state"] == "aborted"
    assert [i["host"] for i in aborted["instances"]] == [HOSTS[0]]
    assert set(_releases(kw).values()) == {"v1"}
    assert _status(kw)["instances"][0]["state"] == "reverted"


def test_a_quiet_canary_follows_on_no_traffic(kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    quiet = _app(tmp_path, "quiet", 'bake = "1s"\non_no_traffic = "halt"\n')
    failed = kw.run("deploy", "shop", str(quiet), timeout_s=240)
    assert failed.code == 1 and "no request during bake" in failed.err, failed.err
    rollout = _status(kw)
    assert (rollout["state"], rollout["cohort"]) == ("halted", 1)
    assert rollout["figures"]["verdict"] == "halt" and rollout["figures"]["responses"] == 0
    releases = _releases(kw)
    assert releases[HOSTS[0]] == "v2" and set(releases[h] for h in HOSTS[1:]) == {"v1"}
    # A person decided: resume goes on past the canary's figures. Each cohort is judged
    # by the same rule, so with requests coming in now it reaches all twenty.
    stop = threading.Event()

    def traffic(host: str) -> None:  # every instance asked every 50 ms, until the end
        while not stop.is_set():
            kw.get(host, "/health")  # the app's, counted (the router's own is not)
            time.sleep(0.05)

    senders = [threading.Thread(target=traffic, args=(host,)) for host in HOSTS]
    for sender in senders:
        sender.start()
    try:
        kw.ok("rollout", "resume", "shop", timeout_s=240)
    finally:
        stop.set()
        for sender in senders:
            sender.join()
    assert _status(kw)["state"] == "done"
    assert set(_releases(kw).values()) == {"v2"}


def test_a_newer_release_supersedes_a_rollout_under_way(kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    slow = _app(tmp_path, "slow", 'bake = "3s"\n')
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(kw.run, "deploy", "shop", str(slow), timeout_s=240)
        deadline = time.monotonic() + 60  # until its canary is baking
        while _status(kw)["release"] != "v2" and time.monotonic() < deadline:
            time.sleep(0.1)
        kw.ok("config", "shop", "set", "GREETING=newer", timeout_s=240)
        older = first.result()
    assert older.code == 1, older.err
    rollouts = _status(kw)
    assert (rollouts["release"], rollouts["state"]) == ("v3", "done")
    assert set(_releases(kw).values()) == {"v3"}


def test_a_releases_own_rollout_keys_shape_its_cohorts_and_a_bad_one_changes_nothing(
        kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    before = kw.store_dump()
    refused = kw.run("config", "shop", "set", "GREETING=hi", "--rollout", "cohorts=50%",
                     "--json")
    assert refused.code == 1 and refused.json()["error"]["code"] == "bad-request"
    assert "--rollout cohorts" in refused.json()["error"]["message"]
    assert kw.run("config", "shop", "set", "GREETING=hi", "--rollout", "parallel").code == 1
    assert kw.store_dump() == before and _status(kw)["release"] == "v1"
    kw.ok("config", "shop", "set", "GREETING=hi", "--rollout", "canary=2",
          "--rollout", "cohorts=50%,100%", "--rollout", "parallel=4", timeout_s=240)
    rollout = _status(kw)
    assert rollout["overrides"] == {"canary": "2", "cohorts": "50%,100%", "parallel": "4"}
    assert [i["cohort"] for i in rollout["instances"]] == [1] * 2 + [2] * 8 + [3] * 10
    assert set(_releases(kw).values()) == {"v2"}


def test_a_paused_rollout_stops_before_its_next_cohort_and_resumes_from_there(
        kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw, _app(tmp_path, "a"))
    slow = _app(tmp_path, "slow", 'bake = "2s"\n')
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(kw.run, "deploy", "shop", str(slow), timeout_s=240)
        deadline = time.monotonic() + 60  # until the canary took it and bakes
        while time.monotonic() < deadline and not (
                (now := _status(kw))["release"] == "v2"
                and now["instances"][0]["state"] == "rolled"):
            time.sleep(0.05)
        paused = kw.ok("rollout", "pause", "shop", "--json").json()["rollout"]
        assert paused["state"] == "paused"
        stopped = running.result()
    assert stopped.code == 1 and "the rollout is paused" in stopped.err, stopped.err
    rollout = _status(kw)
    assert rollout["state"] == "paused" and rollout["cohort"] in (1, 2)
    assert kw.run("rollout", "pause", "shop").code == 1  # nothing running to pause
    releases = _releases(kw)
    assert releases[HOSTS[0]] == "v2" and list(releases.values()).count("v2") < 20
    kw.ok("rollout", "resume", "shop", timeout_s=240)
    assert _status(kw)["state"] == "done" and set(_releases(kw).values()) == {"v2"}
