"""Scheduled jobs through the real CLI and a real daemon: runs on the schedule's own
minute in every instance (a parked one without waking it), with the config vars; by
hand; the overlap rule; failures and refusals said; and a control-plane SIGKILL as a
scheduled run starts, which never runs it twice.

The schedule tests wait for a minute to turn: the daemon's job clock is shifted
(`KEELWAY_JOBS_CLOCK_SHIFT_S`, keelway/clock.py) so that one turns some seconds after
it starts, rather than up to a minute later. They run on one daemon at once, and the
crash gets a daemon of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keelway.deploy.jobs import parse_key
from keelway.home import Home
from keelway.journal import OpKind
from keelway.store import SqliteStore
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, free_port, gone, wait_until
from tests.invariants import violations

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB_PY = '''\
import os, sys, time
what = sys.argv[1]
data = os.environ["KEELWAY_DATA_DIR"]
if what == "tick":
    with open(os.path.join(data, "ticks"), "a") as f:
        f.write(f"{os.environ['KEELWAY_JOB_SCHEDULED']} {os.environ.get('GREETING')} "
                f"{os.environ['KEELWAY_INSTANCE']} {os.getuid()}\\n")
elif what == "slow":
    print("slow begins", flush=True)
    time.sleep(float(sys.argv[2]))
    print("slow done", flush=True)
elif what == "fail":
    print("failing on purpose", file=sys.stderr)
    sys.exit(3)
'''

JOBS_TOML = '''
[jobs.tick]
schedule = "* * * * *"
command = "python3 job.py tick"

[jobs.slow]
schedule = "0 0 1 1 *"
command = "python3 job.py slow 4"

[jobs.fail]
schedule = "0 0 1 1 *"
command = "python3 job.py fail"

[jobs.hang]
schedule = "0 0 1 1 *"
command = "python3 job.py slow 60"
timeout = "1s"

[jobs.wakeful]
schedule = "0 0 1 1 *"
command = "python3 job.py slow 0"
wake = true
'''


def _app(root: Path, jobs: str = JOBS_TOML) -> Path:
    app = hello(root, "cron")
    (app / "job.py").write_text(JOB_PY)
    with (app / "keelway.toml").open("a") as toml:
        toml.write(jobs)
    return app


def shift_for(seconds: float) -> float:
    """A job clock shift that makes its next minute turn `seconds` from now."""
    return (60 - seconds - time.time() % 60) % 60


@contextlib.contextmanager
def minute_in(seconds: float) -> Iterator[None]:
    """The daemons started inside: their job clock's next minute `seconds` away."""
    os.environ["KEELWAY_JOBS_CLOCK_SHIFT_S"] = str(shift_for(seconds))
    try:
        yield
    finally:
        del os.environ["KEELWAY_JOBS_CLOCK_SHIFT_S"]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keelway]:
    root = tmp_path_factory.mktemp("jobs")
    kw = Keelway(home=root / "kh", http_port=free_port())
    try:
        # The job clock's next minute turns 20 s from now: after the setup below.
        with minute_in(20):
            kw.up()
        kw.ok("deploy", "cron", str(_app(root)), "--host", "a.test", "--host", "b.test",
              "--host", "c.test")
        kw.ok("config", "cron", "set", "GREETING=hi-from-config")
        kw.ok("park", "c.test")
        yield kw
    finally:
        kw.teardown()


def _runs(kw: Keelway) -> list[dict[str, Any]]:
    return list(kw.ok("jobs", "cron", "--json").json()["runs"])


def _ended(kw: Keelway, job: str, host: str, count: int = 1) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def done() -> bool:
        found[:] = [r for r in _runs(kw) if r["job"] == job and r["instance"] == host]
        return len(found) >= count and all(r["state"] != "running" for r in found)

    assert wait_until(done, 30, 0.2), found
    return found


def test_a_run_by_hand_fails_with_its_exit_code_and_its_output_in_its_log(
        deployed: Keelway) -> None:
    kw = deployed
    said = kw.ok("jobs", "run", "cron", "fail", "--instance", "a.test").out
    assert "fail started on a.test" in said
    (run,) = _ended(kw, "fail", "a.test")
    assert run["state"] == "failed" and run["error"] == "fail exited with code 3"
    assert run["by_hand"] and run["scheduled"] is None
    logs = kw.ok("logs", "cron", "--service", "job.fail", "--instance", "a.test").out
    assert "failing on purpose" in logs
    events = kw.ok("events", "cron").out
    assert "fail (by hand) started in v2" in events and "fail exited with code 3" in events


def test_a_run_due_while_the_last_runs_is_skipped_and_said(deployed: Keelway) -> None:
    kw = deployed
    kw.ok("jobs", "run", "cron", "slow", "--instance", "b.test")
    kw.ok("jobs", "run", "cron", "slow", "--instance", "b.test")
    (run,) = _ended(kw, "slow", "b.test")
    assert run["state"] == "succeeded" and run["error"] is None
    assert "slow (by hand) skipped: its previous run is still under way" in kw.ok(
        "events", "cron").out
    assert "slow done" in kw.ok("logs", "cron", "--service", "job.slow").out


def test_bad_requests_are_refused_and_change_nothing(deployed: Keelway) -> None:
    kw = deployed
    before = len(_runs(kw))
    unknown = kw.run("jobs", "run", "cron", "weekly")
    assert unknown.code != 0 and "cron has no job 'weekly'" in unknown.err
    assert "its jobs: fail, hang, slow, tick, wakeful" in unknown.err
    for args in (("jobs", "nope"), ("jobs", "run", "nope", "tick"),
                 ("jobs", "run", "cron", "tick", "--instance", "z.test"),
                 ("jobs", "run", "cron", "tick", "--instance", "Bad Host")):
        done = kw.run(*args, "--json")
        assert done.code != 0 and done.json()["error"]["code"] in ("not-found", "bad-request")
    assert len(_runs(kw)) == before
    listing = kw.ok("jobs", "cron").out
    assert "tick" in listing and "* * * * *" in listing and "3 instances" in listing


def test_a_job_runs_at_its_minute_in_every_instance_a_parked_one_without_waking(
        deployed: Keelway) -> None:
    kw = deployed
    home = Home(kw.home)

    def ticked() -> bool:
        return all((home.data_dir(h) / "ticks").exists() for h in ("a.test", "b.test",
                                                                    "c.test"))

    assert wait_until(ticked, 75, 0.5)
    lines = {h: (home.data_dir(h) / "ticks").read_text().split("\n")[0].split()
             for h in ("a.test", "b.test", "c.test")}
    for host, (scheduled, greeting, instance, uid) in lines.items():
        assert scheduled.endswith(":00Z") and greeting == "hi-from-config" and instance == host
        # The instance's identity, whose files its data dir holds (a uid of its own
        # where the box gives each instance one: keelway/identity.py).
        assert int(uid) == os.stat(home.data_dir(host)).st_uid
    (app,) = [a for a in kw.ok("status", "--json").json()["apps"] if a["name"] == "cron"]
    states = {i["host"]: i["state"] for i in app["instances"]}
    assert states["c.test"] == "parked"
    ticks = [r for r in _runs(kw) if r["job"] == "tick"]
    keys = [(r["instance"], r["scheduled"]) for r in ticks]
    assert len(keys) == len(set(keys))  # each instance ran each time once


def test_a_run_past_its_timeout_is_stopped_and_said(deployed: Keelway) -> None:
    kw = deployed
    began = time.monotonic()
    kw.ok("jobs", "run", "cron", "hang", "--instance", "a.test")
    (run,) = _ended(kw, "hang", "a.test")
    assert run["state"] == "failed"
    assert run["error"] == "hang ran past its timeout of 1s and was stopped"
    assert time.monotonic() - began < 15


def test_a_job_that_says_wake_wakes_its_parked_instance_first(deployed: Keelway) -> None:
    """Last of the module's tests on its daemon: c.test is awake after it."""
    kw = deployed
    kw.ok("jobs", "run", "cron", "wakeful", "--instance", "c.test")
    (run,) = _ended(kw, "wakeful", "c.test")
    assert run["state"] == "succeeded"
    (app,) = [a for a in kw.ok("status", "--json").json()["apps"] if a["name"] == "cron"]
    assert {i["host"]: i["state"] for i in app["instances"]}["c.test"] == "running"


def test_a_crash_as_a_scheduled_run_starts_never_runs_it_twice(
        tmp_path: Path) -> None:
    kw = Keelway(home=tmp_path / "kh", http_port=free_port())
    try:
        kw.up()
        kw.ok("deploy", "cron", str(_app(tmp_path, JOBS_TOML.split("[jobs.slow]")[0])),
              "--host", "a.test")
        kw.ok("down", "--keep-apps")
        # The next control plane dies as the first scheduled run's process has started
        # and before its pid is journaled: the crash window of a run begun.
        up = subprocess.run(
            [sys.executable, "-m", "keelway.cli.main", "up", "-d", "--http",
             f"127.0.0.1:{kw.http_port}", "--json"],
            env={**kw.env(), "KEELWAY_FAILPOINTS": "job.spawn.after",
                 "KEELWAY_JOBS_CLOCK_SHIFT_S": str(shift_for(5))},
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert up.returncode == 0, up.stderr
        pid = int(json.loads(up.stdout)["pid"])
        assert gone(pid, timeout_s=80), "the scheduled run never began"
        kw.up()
        store = SqliteStore(kw.home / "keelway.db")
        try:
            def ended() -> bool:
                return not [o for o in store.ops.unfinished_runs() if o.kind is OpKind.JOB]

            assert wait_until(ended, 30, 0.2)
            (crashed,) = store.ops.keyed_operations(OpKind.JOB, 0.0)
            assert crashed.state.value == "failed"
            assert "interrupted by a control-plane crash" in (crashed.error or "")
            time.sleep(3)  # a second start of the same time (it must not come) is due now
            runs = [o.key for o in store.ops.keyed_operations(OpKind.JOB, 0.0)]
            assert runs.count(crashed.key) == 1
        finally:
            store.close()
        parsed = parse_key(crashed.key or "")
        assert parsed is not None
        at = parsed[1].strftime("%Y-%m-%dT%H:%M:%SZ")
        ticks = Home(kw.home).data_dir("a.test") / "ticks"
        lines = ticks.read_text().splitlines() if ticks.exists() else []
        assert sum(line.startswith(at) for line in lines) <= 1, lines
        assert violations(kw.home) == []
    finally:
        kw.teardown()
