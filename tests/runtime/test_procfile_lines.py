"""Procfile lines run as a shell runs them (`sh -c`, as Heroku does), with the app, not
the shell, leading its generation wherever that cannot change what the line means
(keelway/runtime/shell.py); and a stop is graceful either way. Real processes."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from keelway.app_path import SYSTEM_PATH
from keelway.clock import SystemClock
from keelway.home import Home
from keelway.runtime import process
from keelway.runtime.logs import log_path
from keelway.runtime.shell import shell_argv
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState
from keelway.store.records import Generation

# Writes its pid and its GREETING, then on SIGTERM takes 0.3 s to shut down (as a web
# finishing its requests does) before it says so and exits 0.
GRACEFUL = '''
import os, signal, sys, time
def term(*_):
    time.sleep(0.3)
    open("stopped", "w").write("cleanly")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open("pid", "w").write(str(os.getpid()))
print("greeting:", os.environ.get("GREETING"), flush=True)
while True:
    time.sleep(1)
'''


@pytest.mark.parametrize(("line", "script"), [
    ("gunicorn app:app", "exec gunicorn app:app"),
    ("ISSO_SETTINGS=isso.cfg isso run", "ISSO_SETTINGS=isso.cfg exec isso run"),
    ('A="x y" B=2 python3 web.py --sep ";"', 'A="x y" B=2 exec python3 web.py --sep ";"'),
    ("cd app && X=1 gunicorn x", "cd app && X=1 exec gunicorn x"),
    ("migrate || true; serve", "migrate || true; exec serve"),
    ("serve >>out.log 2>&1 # logs", "exec serve >>out.log 2>&1 # logs"),
    ("python3 -c 'import os; os.system(\"x\")'", "exec python3 -c 'import os; os.system(\"x\")'"),
    # Lines an `exec` would change, or that already have one: run as written.
    ("serve | logger", "serve | logger"),
    ("serve & wait", "serve & wait"),
    ("(cd app && serve)", "(cd app && serve)"),
    ("serve --name $(hostname)", "serve --name $(hostname)"),
    ('serve --name "`hostname`"', 'serve --name "`hostname`"'),
    ("if true; then serve; fi", "if true; then serve; fi"),
    ("exec serve", "exec serve"),
    ("X=1", "X=1"),
    ("serve;", "serve;"),
    ("echo 'unclosed", "echo 'unclosed"),
])
def test_exec_goes_before_the_last_command_only_where_it_cannot_change_the_line(
    line: str, script: str
) -> None:
    assert shell_argv(line) == ["/bin/sh", "-c", script]


async def _no_restart(_gen: Generation, _code: int | None) -> None:
    return None


def _run_and_stop(store: Store, home: Home, tmp_path: Path, line: str) -> Generation:
    """Spawn `line` as a worker, wait until the app wrote its pid, stop it (grace 5 s)."""
    (tmp_path / "app.py").write_text(textwrap.dedent(GRACEFUL))

    async def scenario() -> Generation:
        supervisor = Supervisor(store, home, SystemClock(), _no_restart)
        gen = store.plan_generation(app="hello", instance="one.test", service="worker",
                                                release=1, build_digest="d" * 64, op_id=None,
                                                port=None)
        gen = await supervisor.spawn(gen, line, tmp_path, {"PATH": SYSTEM_PATH})
        try:
            for _ in range(500):
                if (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text():
                    break
                await asyncio.sleep(0.01)
            assert await supervisor.stop(store.generations.get_generation(gen.id) or gen,
                                         grace_s=5.0)
        finally:
            await supervisor.shutdown()
        latest = store.generations.get_generation(gen.id)
        assert latest is not None
        return latest

    return asyncio.run(scenario())


def test_a_line_that_starts_with_assignments_runs_its_command_with_them_set(
    store: Store, home: Home, tmp_path: Path
) -> None:
    gen = _run_and_stop(store, home, tmp_path, "GREETING='hi there' python3 app.py")
    assert gen.state is GenState.GONE
    assert "greeting: hi there" in log_path(home.log_dir("one.test"), "worker",
                                            gen.id).read_text()
    # The app itself led the generation (the shell exec'd it) and shut down in its grace.
    assert store.local.presence(gen.id).pid == int((tmp_path / "pid").read_text())
    assert (tmp_path / "stopped").read_text() == "cleanly" and gen.exit_code == 0


def test_the_app_of_a_cd_and_command_line_leads_its_generation_and_stops_gracefully(
    store: Store, home: Home, tmp_path: Path
) -> None:
    gen = _run_and_stop(store, home, tmp_path, "cd . && GREETING=hi python3 app.py")
    assert store.local.presence(gen.id).pid == int((tmp_path / "pid").read_text())
    assert (tmp_path / "stopped").read_text() == "cleanly"


def test_an_app_under_a_shell_that_stays_still_gets_its_stop_grace(
    store: Store, home: Home, tmp_path: Path
) -> None:
    # A pipeline: the shell leads and dies of the SIGTERM at once; the app must still be
    # given its grace, not be killed with the shell's tree.
    gen = _run_and_stop(store, home, tmp_path, "python3 app.py | cat")
    app_pid = int((tmp_path / "pid").read_text())
    assert store.local.presence(gen.id).pid != app_pid and gen.state is GenState.GONE
    assert (tmp_path / "stopped").read_text() == "cleanly"
    stat = process.read_stat(app_pid)
    assert stat is None or stat.state == "Z"  # dead; its reaper is whoever adopted it
