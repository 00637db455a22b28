"""Schema migration 10: a generation's box-local facts (port, pid, start ticks) leave
its row for `presences` (keelway/store/local.py). A home written before keeps every one
of them, so the control plane that opens it after the upgrade adopts what still runs."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from pathlib import Path

import pytest

from keelway.home import Home
from keelway.runtime import process
from keelway.runtime.supervisor import Supervisor
from keelway.store import Conflict, SqliteStore
from keelway.store.lifecycle import GenState
from keelway.store.records import Generation, Presence
from keelway.store.schema import MIGRATIONS, _statements
from keelway.testing.clock import FakeClock


def _home_of_schema_9(path: Path, pid: int, ticks: int) -> None:
    """A store as keelway wrote it before migration 10: a running web holding port 4100,
    a worker gone (its claim freed with the proof, its pid kept on the row)."""
    conn = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:9]:
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 9")
    conn.execute("INSERT INTO apps(name, created_at) VALUES ('blog', 0)")
    conn.execute("INSERT INTO instances(host, app, state, created_at) VALUES"
                 " ('a.test', 'blog', 'running', 0)")
    conn.execute("INSERT INTO generations(id, app, instance, service, release, build_digest,"
                 " state, pid, start_ticks, port, created_at) VALUES (1, 'blog', 'a.test',"
                 " 'web', 1, 'd', 'ready', ?, ?, 4100, 0)", (pid, ticks))
    conn.execute("INSERT INTO port_claims(port, generation_id, claimed_at) VALUES (4100, 1, 0)")
    conn.execute("INSERT INTO generations(id, app, instance, service, release, build_digest,"
                 " state, pid, start_ticks, created_at, exit_code) VALUES (2, 'blog', 'a.test',"
                 " 'worker', 1, 'd', 'gone', 77, 5, 0, 0)")
    conn.close()


async def _no_restart(_gen: Generation, _code: int | None) -> None:
    return None


def test_an_old_home_keeps_its_generations_presences_and_adopts_what_runs(
    tmp_path: Path,
) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        stat = process.read_stat(sleeper.pid)
        assert stat is not None
        _home_of_schema_9(tmp_path / "keelway.db", sleeper.pid, stat.start_ticks)
        store = SqliteStore(tmp_path / "keelway.db", FakeClock())
        try:
            assert store.local.presences([1, 2]) == {
                1: Presence(1, 4100, sleeper.pid, stat.start_ticks),
                2: Presence(2, None, 77, 5)}
            assert store.local.claimed_ports() == {4100}
            web = store.generations.get_generation(1)
            assert web is not None and web.state is GenState.READY

            async def adopted() -> bool:
                supervisor = Supervisor(store, Home(tmp_path), store.clock, _no_restart)
                try:
                    return supervisor.adopt(web) and supervisor.is_watched(web.id)
                finally:
                    await supervisor.shutdown()

            assert asyncio.run(adopted())
            # The claim came along: no new generation takes the port it still holds.
            with pytest.raises(Conflict, match="port 4100"):
                store.plan_generation(app="blog", instance="a.test", service="web",
                                      release=2, build_digest="d", op_id=None, port=4100)
        finally:
            store.close()
    finally:
        sleeper.kill()
        sleeper.wait()
