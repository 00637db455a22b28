"""`status` and the commands that read tell the truth, through the real CLI and daemon:
each instance state (keelway/api/instance_state.py) as `status` and `--json` say it,
the release of a parked or crashed instance, no pid of a dead process, `releases`
marking the current and failed releases and their source, `ops`/`events`/`logs`
options, and the messages of park and config."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from keelway.cli.output import EXIT_LOST
from tests.deploy.apps import DIES_AFTER_READY, hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"
# Boots once; every later start exits at once (its marker is in the data dir), so once
# it dies the instance waits out its crash backoff.
DIES_THEN_CANNOT_BOOT = (
    "python3 -c \"import os, sys, threading, time, runpy; "
    "mark = os.path.join(os.environ['KEELWAY_DATA_DIR'], 'booted'); "
    "os.path.exists(mark) and sys.exit(4); open(mark, 'w').close(); "
    "threading.Thread(target=lambda: (time.sleep(1), os._exit(7)), daemon=True).start(); "
    "runpy.run_path('web.py', run_name='__main__')\"")
EXITS_AT_BOOT = "python3 -c 'import sys; sys.exit(3)'"


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich tables as wide as a line needs, so that a test reads whole cells."""
    monkeypatch.setenv("COLUMNS", "220")


def _instance(kw: Keelway, host: str = HOST) -> dict[str, Any]:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            if inst["host"] == host:
                return dict(inst)
    raise AssertionError(f"no instance {host}")


def _row(kw: Keelway, host: str = HOST) -> str:
    """The first line of `status` (the human table) that names `host`."""
    return next(line for line in kw.ok("status").out.splitlines() if f" {host} " in line)


def test_an_instance_never_released_says_no_release_and_a_failed_first_deploy_says_failed(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("apps", "create", "empty")
    kw.ok("instances", "add", "empty", "empty.test")
    inst = _instance(kw, "empty.test")
    assert (inst["state"], inst["label"], inst["release"]) == ("no release", "no release", None)
    assert "no release" in _row(kw, "empty.test") and "running" not in _row(kw, "empty.test")
    listed = kw.ok("instances", "list", "empty", "--json").json()["instances"]
    assert [i["state"] for i in listed] == ["no release"]

    bad = hello(tmp_path, "bad", web_cmd=EXITS_AT_BOOT)
    assert kw.run("deploy", "hello", str(bad), "--host", HOST).code != 0
    inst = _instance(kw)
    assert inst["state"] == "failed" and inst["failed_operation"] == "deploy"
    assert inst["label"] == "failed (last deploy failed; serving nothing)"
    assert "failed (last deploy failed; serving nothing)" in _row(kw)
    # No release was written (nothing took traffic), and `releases` says what failed.
    answer = kw.ok("releases", "hello", "--json").json()
    assert answer["releases"] == [] and [(f["version"], f["instance"]) for f in
                                         answer["unreleased_failures"]] == [("v1", HOST)]
    assert f"v1 (build {answer['unreleased_failures'][0]['build']}) failed on {HOST} before " \
        "it was released" in kw.ok("releases", "hello").out


def test_a_deploy_that_failed_its_settle_says_failed_serving_the_release_it_fell_back_to(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    broken = hello(tmp_path, "b", web_cmd=DIES_AFTER_READY, settle="1.5s",
                   web_mode="overlap", worker_mode="overlap")
    assert kw.run("deploy", "hello", str(broken)).code != 0
    inst = _instance(kw)
    assert inst["label"] == "failed (last deploy failed; serving v1)", inst
    assert inst["release"] == "v1" and inst["serving"] == "v1"
    assert "hello (newest v2 runs nowhere)" in kw.ok("status").out

    releases = {r["version"]: r for r in kw.ok("releases", "hello", "--json").json()["releases"]}
    assert releases["v1"]["current"] == [HOST] and releases["v1"]["failed_on"] == []
    assert releases["v2"]["current"] == [] and releases["v2"]["failed_on"] == [HOST]
    table = kw.ok("releases", "hello").out
    assert f"current ({HOST})" in table and f"failed on {HOST}" in table

    # A release that takes clears it: the instance runs again, and says so.
    kw.ok("deploy", "hello", str(hello(tmp_path, "c", greeting="hi from")))
    inst = _instance(kw)
    assert (inst["state"], inst["release"]) == ("running", "v3")


def test_an_instance_whose_web_crashed_says_crashed_with_its_next_retry_and_keeps_its_release(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a", web_cmd=DIES_THEN_CANNOT_BOOT)),
          "--host", HOST)
    assert wait_until(lambda: _instance(kw)["state"] == "crashed", 30)
    inst = _instance(kw)
    assert inst["label"].startswith("crashed (next retry at ") and inst["next_retry_at"]
    assert inst["release"] == "v1" and inst["desired"] == "running"
    web = next(p for p in inst["processes"] if p["service"] == "web")
    if web["state"] == "gone":  # between tries: a dead process has no pid and no port
        assert (web["pid"], web["port"]) == (None, None)
    assert "crashed (next retry at " in _row(kw)


def test_a_parked_and_a_stopped_instance_say_so_with_their_release_and_no_dead_pids(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    running = [p for p in _instance(kw)["processes"] if p["pid"]]
    said = kw.ok("park", HOST).out
    # Every process it stopped, the replicator too when one runs, in good grammar.
    assert f"(stopped {len(running)} processes)" in said, (said, running)
    inst = _instance(kw)
    assert (inst["state"], inst["release"]) == ("parked", "v1")
    assert all(p["pid"] is None and p["port"] is None for p in inst["processes"])
    row = _row(kw)
    assert " parked " in row and " v1 " in row

    kw.ok("wake", HOST)
    kw.ok("stop", "hello")
    inst = _instance(kw)
    assert (inst["state"], inst["release"]) == ("stopped", "v1")
    assert " stopped " in _row(kw)


def test_config_quotes_a_value_with_a_newline_and_says_a_parked_instance_stays_parked(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    kw.ok("config", "hello", "set", "PEM=line one\nline two", "PLAIN=x")
    lines = kw.ok("config", "hello").out.splitlines()
    assert 'PEM="line one\\nline two"' in lines and "PLAIN=x" in lines, lines
    instance_lines = kw.ok("config", "hello", "--instance", HOST).out
    assert 'PEM="line one\\nline two"  (app)' in instance_lines
    assert "KEELWAY_INSTANCE_KEY" not in instance_lines + "\n".join(lines)

    kw.ok("park", HOST)
    said = kw.ok("config", "hello", "--instance", HOST, "set", "GREETING=hey").out
    assert "stays parked" in said and "restarted" not in said, said
    assert kw.ok("config", "hello", "--instance", HOST, "set", "X=1", "--json").json()[
        "restarted"] == []
    assert _instance(kw)["state"] == "parked" and kw.app_pids() == []
    # As it says: its next wake runs with the change.
    kw.ok("wake", HOST)
    web = next(p for p in _instance(kw)["processes"] if p["service"] == "web" and p["pid"])
    assert b"GREETING=hey" in Path(f"/proc/{web['pid']}/environ").read_bytes().split(b"\0")


def test_releases_say_which_git_commit_or_tarball_each_build_came_from(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    repo = hello(tmp_path, "repo")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    kw.ok("deploy", "hello", str(repo), "--ref", "main", "--host", HOST)
    tarball = tmp_path / "app.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(hello(tmp_path, "tarred", greeting="tar from"), arcname=".")
    kw.ok("deploy", "hello", str(tarball))
    kw.ok("deploy", "hello", str(hello(tmp_path, "dir", greeting="dir from")))

    releases = {r["version"]: r for r in kw.ok("releases", "hello", "--json").json()["releases"]}
    assert releases["v1"]["source"] | {"path": ""} == {
        "kind": "git", "commit": commit, "ref": "main", "path": ""}
    assert releases["v2"]["source"]["kind"] == "tarball"
    assert len(releases["v2"]["source"]["sha256"]) == 64
    assert releases["v3"]["source"]["kind"] == "directory"
    assert releases["v3"]["current"] == [HOST]
    table = kw.ok("releases", "hello").out
    assert f"git {commit[:12]} (main)" in table and "tarball sha256:" in table


def test_ops_and_events_take_n_and_ops_show_when_each_step_began_and_how_long_it_took(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    kw.ok("restart", "hello")
    ops = kw.ok("ops", "hello", "-n", "1", "--json").json()["operations"]
    assert [op["kind"] for op in ops] == ["restart"]
    step = ops[0]["steps"][0]
    assert step["started_at"] <= step["finished_at"] and step["duration_s"] >= 0
    shown = kw.ok("ops", "hello", "-n", "1").out.splitlines()
    assert len([line for line in shown if line.startswith("op ")]) == 1
    began = time.strftime("%H:%M:%S", time.localtime(step["started_at"]))
    assert any(began in line and "s" in line.split(began)[1] for line in shown[1:]), shown

    every = kw.ok("events", "hello", "--json").json()["events"]
    assert len(every) >= 2
    newest = kw.ok("events", "hello", "-n", "1", "--json").json()["events"]
    assert newest == every[-1:]
    assert len(kw.ok("events", "hello", "-n", "1").out.splitlines()) == 1
    assert kw.run("events", "hello", "-n", "-1").code == 2  # refused by the CLI


def _follow(kw: Keelway) -> subprocess.Popen[str]:
    # -X faulthandler: a follower that outlives its wait is made to say where it is
    # (`_ended`), rather than only time out.
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "keelway.cli.main", "events", "hello",
         "-f", "-n", "0"],
        env=kw.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible)


def _interruptible() -> None:
    """Ctrl-C as a terminal gives it: a shell that starts a job in the background
    without job control (CI's, as `cmd &`) sets SIGINT ignored for it and its children,
    and Python makes KeyboardInterrupt of SIGINT only where it was not ignored at start
    (seen: the follower stuck in its long poll after the SIGINT, its stack dumped)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ended(follower: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    """The follower's stdout and stderr once it exits by itself within `timeout_s`. One
    that does not is made to dump its threads' stacks (SIGABRT: faulthandler), and the
    test fails with them; either way its pipes are closed here, so a failure leaves no
    open file for a later test's warnings."""
    with follower:
        try:
            return follower.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            follower.send_signal(signal.SIGABRT)
            try:
                out, err = follower.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                follower.kill()
                out, err = follower.communicate()
            raise AssertionError(f"the follower did not exit in {timeout_s:g}s; "
                                 f"it was at:\n{err}\n(stdout: {out!r})") from None


def test_events_follow_prints_new_events_and_exits_cleanly_on_ctrl_c_and_when_the_daemon_goes(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    follower = _follow(kw)
    try:
        time.sleep(1.0)  # it is polling
        kw.ok("restart", "hello")
        time.sleep(1.0)
        follower.send_signal(signal.SIGINT)
    except BaseException:
        follower.kill()
        raise
    finally:
        out, err = _ended(follower, 20)
    assert follower.returncode == 0 and "Traceback" not in err, err
    assert "op: restart succeeded" in out and "op: deploy" not in out, out

    follower = _follow(kw)
    try:
        time.sleep(1.0)
        kw.kill_daemon()
    except BaseException:
        follower.kill()
        raise
    finally:
        _out, err = _ended(follower, 30)
    assert "Traceback" not in err and follower.returncode == EXIT_LOST, err
    assert "went away" in err and "nothing was changed" in err


def test_logs_never_show_a_purged_instance_whose_host_was_added_again(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST, "--host", "two.test")
    assert wait_until(lambda: bool(kw.ok("logs", "hello", "--instance", HOST, "--json").out))
    old = {i["generation"] for i in _log_items(kw)}
    kw.ok("instances", "remove", "hello", HOST, "--purge-data")
    assert _log_items(kw, HOST) == []
    kw.ok("instances", "add", "hello", HOST)
    ours = {p["id"] for p in _instance(kw)["processes"]}
    assert wait_until(lambda: bool(_log_items(kw, HOST)))
    shown = {i["generation"] for i in _log_items(kw, HOST)}
    assert shown <= ours and not shown & old, (shown, ours, old)


def _log_items(kw: Keelway, host: str = HOST) -> list[dict[str, Any]]:
    out = kw.ok("logs", "hello", "--instance", host, "-n", "50", "--json").out
    return [json.loads(line) for line in out.splitlines() if line.strip()]
