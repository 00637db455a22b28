"""`keelway run`: the real CLI against a real daemon, the command on the CLI's stdio.

One daemon for the module (a deploy costs seconds): each test leaves the app as it found
it. The control-plane crash gets a daemon of its own.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keelway.deploy.passes import PERIODIC_S
from keelway.runtime import process
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, Result, free_port, gone, wait_until

pytestmark = pytest.mark.slow

HOST = "blog.test"
SECRET = "s3cr3t-5a1d-never-shown"
ARG_SECRET = "hunter2-on-the-command-line"

MANAGE_PY = '''\
import os, sys
import store

command = sys.argv[1]
if command == "env":
    print("GREETING", os.environ.get("GREETING"))
    print("SECRET", os.environ.get("SECRET_TOKEN"))
    print("DB", os.environ["KEELWAY_DB"])
    print("CWD", os.getcwd())
    print("TTY", os.isatty(0))
elif command == "visit":
    conn = store.connect()
    conn.execute("INSERT INTO visits(n) VALUES (?)", (int(sys.argv[2]),))
    print("visits", conn.execute("SELECT count(*) FROM visits").fetchone()[0])
elif command == "exit":
    sys.exit(int(sys.argv[2]))
elif command == "upper":
    sys.stdout.write(sys.stdin.read().upper())
'''

# Ignores the hangup and SIGTERM, and so does the child it leaves behind (an ignored
# signal stays ignored across exec): only SIGKILL of the whole tree ends them.
STUBBORN = ("import signal, subprocess, time\n"
            "for s in (signal.SIGHUP, signal.SIGTERM): signal.signal(s, signal.SIG_IGN)\n"
            "subprocess.Popen(['sleep', '300'])\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n")


def _app(root: Path, name: str, **kwargs: Any) -> Path:
    app = hello(root, name, **kwargs)
    (app / "manage.py").write_text(MANAGE_PY)
    return app


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keelway]:
    root = tmp_path_factory.mktemp("run")
    kw = Keelway(home=root / "kh", http_port=free_port())
    try:
        kw.up()
        kw.ok("deploy", "blog", str(_app(root, "blog")), "--host", HOST)
        kw.ok("config", "blog", "set", "GREETING=hi there", f"SECRET_TOKEN={SECRET}")
        yield kw
    finally:
        kw.teardown()


def run(kw: Keelway, *args: str, stdin: str | None = None, timeout_s: float = 60) -> Result:
    proc = subprocess.run([sys.executable, "-m", "keelway.cli.main", "run", *args],
                          env=kw.env(), capture_output=True, text=True, timeout=timeout_s,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def spawn_cli(kw: Keelway, *args: str) -> subprocess.Popen[str]:
    """A CLI running a command that prints `ready` once it runs; read that line first."""
    cli = subprocess.Popen([sys.executable, "-m", "keelway.cli.main", "run", *args],
                           env=kw.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert cli.stdout is not None
    assert cli.stdout.readline().strip() == "ready"
    return cli


def finish(cli: subprocess.Popen[str]) -> int:
    """The CLI's exit code, its pipes closed (not read to their end: a command that
    outlives its CLI holds them open)."""
    code = cli.wait(timeout=20)
    for pipe in (cli.stdout, cli.stderr):
        if pipe is not None:
            pipe.close()
    return code


def run_ops(kw: Keelway) -> list[dict[str, Any]]:
    ops = kw.ok("ops", "blog", "--json").json()["operations"]
    return [op for op in ops if op["kind"] == "run"]


def run_generation(kw: Keelway) -> dict[str, Any]:
    (app,) = [a for a in kw.ok("status", "--json").json()["apps"] if a["name"] == "blog"]
    (inst,) = app["instances"]
    (gen,) = [p for p in inst["processes"] if p["service"] == "run" and p["state"] != "gone"]
    return dict(gen)


def tree_gone(home: Path, gen_id: int, leader: tuple[int, int]) -> bool:
    """Proven from /proc: the leader is dead, and no process is left of its session or
    carries the generation's marker in its environment."""
    if process.is_alive(*leader) or process.session_members(*leader):
        return False
    marker = {f"KEELWAY_SUPERVISOR={home}".encode(), f"KEELWAY_GENERATION={gen_id}".encode()}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                environ = set(Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if marker <= environ:
                stat = process.read_stat(int(entry.name))
                if stat is not None and stat.state != "Z":
                    return False
    return True


def test_a_manage_py_command_sees_the_config_vars_and_the_database(deployed: Keelway) -> None:
    kw = deployed
    env = run(kw, "blog", "--", "python3", "manage.py", "env")
    assert env.code == 0, env.err
    said = dict(line.split(" ", 1) for line in env.out.splitlines())
    assert said["GREETING"] == "hi there" and said["SECRET"] == SECRET
    assert said["DB"] == str(kw.home / "data" / HOST / "db.sqlite3")
    assert Path(said["CWD"]).is_relative_to(kw.home / "builds" / "blog")
    assert said["TTY"] == "False"
    first = run(kw, "blog", "--instance", HOST, "--", "python3", "manage.py", "visit", "7")
    second = run(kw, "blog", "--", "python3", "manage.py", "visit", "8")
    assert (first.code, second.code) == (0, 0), first.err + second.err
    assert int(second.out.split()[-1]) == int(first.out.split()[-1]) + 1
    with sqlite3.connect(said["DB"]) as conn:  # written where the app itself reads it
        rows = [n for (n,) in conn.execute("SELECT n FROM visits WHERE n IN (7, 8)")]
    assert sorted(rows) == [7, 8]


def test_the_exit_code_passes_through_and_the_run_is_journaled(deployed: Keelway) -> None:
    kw = deployed
    before = len(run_ops(kw))
    result = run(kw, "blog", "--", "python3", "manage.py", "exit", "3")
    assert result.code == 3
    ops = run_ops(kw)
    assert len(ops) == before + 1
    assert ops[0]["state"] == "failed" and "exited with code 3" in ops[0]["error"]
    assert [s["name"] for s in ops[0]["steps"]] == ["run", "run exit"]
    events = [e["message"] for e in kw.ok("events", "blog", "--json").json()["events"]]
    assert any(m.startswith("run of python3 started in v") for m in events)
    assert "run failed: python3 exited with code 3" in events
    # A run is never the latest operation: what convergence reads is still the config.
    status = kw.ok("status", "blog", "--json").json()
    (inst,) = status["apps"][0]["instances"]
    assert inst["last_operation"]["kind"] == "config" and status["leftovers"] == []
    assert kw.get(HOST)[0] == 200


def test_piped_stdin_reaches_the_command_and_json_says_the_outcome(deployed: Keelway) -> None:
    result = run(deployed, "blog", "--json", "--", "python3", "manage.py", "upper",
                 stdin="hello\nworld\n")
    assert (result.code, result.out) == (0, "HELLO\nWORLD\n"), result.err
    outcome = [line for line in result.err.splitlines() if line.startswith("{")]
    assert '"exit_code": 0' in outcome[-1] and f'"instance": "{HOST}"' in outcome[-1]


def test_a_signal_the_user_sends_reaches_the_command(deployed: Keelway) -> None:
    cli = spawn_cli(deployed, "blog", "--", "sh", "-c", "echo ready; exec sleep 60")
    os.kill(cli.pid, signal.SIGINT)
    assert finish(cli) == 128 + signal.SIGINT


def test_an_app_with_no_release_or_no_such_app_gives_a_clear_error(
        deployed: Keelway, tmp_path: Path) -> None:
    kw = deployed
    broken = _app(tmp_path, "broken", web_cmd="python3 -c 'raise SystemExit(1)'")
    assert kw.run("deploy", "broken", str(broken), "--host", "broken.test").code != 0
    result = run(kw, "broken", "--", "true")
    assert result.code == 1
    assert "broken has no release running on broken.test" in result.err
    assert "deploy broken first" in result.err
    missing = run(kw, "nosuch", "--json", "--", "true")
    assert missing.code == 1 and '"code": "not-found"' in missing.out
    assert "no app named nosuch" in missing.out
    assert not [op for op in kw.ok("ops", "broken", "--json").json()["operations"]
                if op["kind"] == "run"]


def test_a_fenced_instance_refuses_a_run_and_starts_nothing(deployed: Keelway) -> None:
    kw = deployed
    before = len(run_ops(kw))
    # `keelway fence` belongs to another part of issue 10: the row it would write.
    with sqlite3.connect(kw.home / "keelway.db", timeout=10) as conn:
        conn.execute("INSERT INTO fences(instance, generation, held, reason, updated_at)"
                     " VALUES (?, 1, 1, 'test', 0)", (HOST,))
    try:
        result = run(kw, "blog", "--", "python3", "manage.py", "env")
        assert result.code == 1 and f"{HOST} is fenced" in result.err, result
        assert "SECRET" not in result.out
        assert len(run_ops(kw)) == before
    finally:
        with sqlite3.connect(kw.home / "keelway.db", timeout=10) as conn:
            conn.execute("DELETE FROM fences WHERE instance=?", (HOST,))
    assert run(kw, "blog", "--", "true").code == 0


def test_a_run_outlives_a_restart_and_a_periodic_pass_of_its_instance(
        deployed: Keelway) -> None:
    # The instance lock is lent out while a run runs, and the reconciler leaves a live
    # run's generation to it: neither an operation nor a pass waits for it or sweeps it.
    kw = deployed
    started = time.monotonic()
    cli = spawn_cli(kw, "blog", "--", "sh", "-c", "echo ready; exec sleep 60")
    gen = run_generation(kw)
    stat = process.read_stat(gen["pid"])
    assert stat is not None
    kw.ok("restart", "blog", timeout_s=30)
    time.sleep(max(0.0, PERIODIC_S + 1 - (time.monotonic() - started)))
    assert process.is_alive(gen["pid"], stat.start_ticks)
    assert kw.ok("status", "--json").json()["leftovers"] == []
    os.kill(cli.pid, signal.SIGTERM)
    assert finish(cli) == 128 + signal.SIGTERM
    assert run_ops(kw)[0]["error"] == "sh exited with code 143"


def test_killing_the_cli_leaves_no_process_of_the_run(deployed: Keelway) -> None:
    kw = deployed
    cli = spawn_cli(kw, "blog", "--", "python3", "-c", STUBBORN)
    gen = run_generation(kw)
    stat = process.read_stat(gen["pid"])
    assert stat is not None
    leader = (gen["pid"], stat.start_ticks)
    assert len(process.session_members(*leader)) == 2  # python and its sleep
    os.kill(cli.pid, signal.SIGKILL)
    finish(cli)
    assert wait_until(lambda: tree_gone(kw.home, gen["id"], leader), 20)
    assert wait_until(lambda: run_ops(kw)[0]["state"] == "failed", 10)
    assert "the terminal went away" in run_ops(kw)[0]["error"]


def test_nothing_secret_is_in_the_api_output_or_the_logs(deployed: Keelway) -> None:
    kw = deployed
    result = run(kw, "blog", "--", "python3", "manage.py", "env", f"--password={ARG_SECRET}")
    assert result.code == 0 and SECRET in result.out  # the command itself sees it
    said = [kw.ok("status", "--json").out, kw.ok("ops", "blog", "--json").out,
            kw.ok("events", "blog", "--json").out]
    for path in (kw.home / "logs").rglob("*"):
        if path.is_file():
            said.append(path.read_text(errors="replace"))
    assert not [text for text in said if SECRET in text or ARG_SECRET in text]


def test_a_control_plane_crash_mid_run_removes_the_run_when_it_comes_back(kw: Keelway,
                                                                          tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "blog", str(_app(tmp_path, "blog")), "--host", HOST)
    cli = spawn_cli(kw, "blog", "--", "sh", "-c", "echo ready; exec sleep 300")
    gen = run_generation(kw)
    stat = process.read_stat(gen["pid"])
    assert stat is not None
    kw.kill_daemon()
    assert finish(cli) == 255
    assert process.is_alive(gen["pid"], stat.start_ticks)  # its terminal is gone, not it
    kw.up()
    assert tree_gone(kw.home, gen["id"], (gen["pid"], stat.start_ticks))
    assert gone(gen["pid"], 1)
    (op,) = run_ops(kw)
    assert op["state"] == "failed" and "control-plane crash" in op["error"]
    assert kw.get(HOST)[0] == 200


def test_keelway_down_hangs_up_a_run_and_journals_it(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "blog", str(_app(tmp_path, "blog")), "--host", HOST)
    cli = spawn_cli(kw, "blog", "--", "sh", "-c", "echo ready; exec sleep 300")
    gen = run_generation(kw)
    stat = process.read_stat(gen["pid"])
    assert stat is not None
    kw.ok("down")
    assert finish(cli) == 128 + signal.SIGHUP
    assert tree_gone(kw.home, gen["id"], (gen["pid"], stat.start_ticks))
    kw.up()
    (op,) = run_ops(kw)
    assert op["state"] == "failed" and "the terminal went away" in op["error"]
