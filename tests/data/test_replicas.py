"""The replicator's configuration and the checks on a restored copy, from values alone."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from keelway.data.replicas import (
    ReplicaError,
    ReplicaOptions,
    Replicas,
    replica_config,
    replica_url,
    verify,
)
from keelway.home import Home


def test_a_replica_lives_under_the_homes_objects_directory_by_default(tmp_path: Path) -> None:
    home = Home(tmp_path)
    assert replica_url(home, "one.test") == (tmp_path / "objects" / "replicas"
                                             / "one.test").resolve().as_uri()


def test_an_s3_objects_url_puts_the_replica_under_its_prefix(tmp_path: Path) -> None:
    url = replica_url(Home(tmp_path), "one.test", "s3://bucket/keel/")
    assert url == "s3://bucket/keel/replicas/one.test"


def test_a_file_replica_config_names_the_database_and_its_directory(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    config = replica_config(db, (tmp_path / "r").as_uri(), ReplicaOptions(0.1, 0.3))
    json.dumps(config)  # what litestream reads (JSON is YAML)
    [entry] = config["dbs"]
    assert entry["path"] == str(db) and entry["monitor-interval"] == "100ms"
    assert entry["replica"] == {"type": "file", "path": str(tmp_path / "r"),
                                "sync-interval": "300ms"}


def test_an_s3_replica_config_has_its_endpoint_and_no_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hush")
    monkeypatch.setenv("AWS_REGION", "eu-1")
    config = replica_config(tmp_path / "db", "s3://b/p/replicas/h", endpoint="http://127.0.0.1:9")
    replica = config["dbs"][0]["replica"]
    assert replica["type"] == "s3" and replica["bucket"] == "b"
    assert replica["path"] == "p/replicas/h" and replica["endpoint"] == "http://127.0.0.1:9"
    assert replica["force-path-style"] is True and replica["region"] == "eu-1"
    assert "hush" not in json.dumps(config)


def test_a_replica_url_of_another_scheme_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReplicaError):
        replica_config(tmp_path / "db", "ftp://x/y")


def _db(path: Path, *rows: str) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(x TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(r,) for r in rows])
    conn.commit()
    conn.close()
    return path


def test_verify_accepts_a_sound_database_and_refuses_garbage(tmp_path: Path) -> None:
    assert verify(_db(tmp_path / "ok.db", "a")) is None
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database" * 100)
    assert verify(bad) is not None
    assert verify(tmp_path / "missing.db") is not None


def test_a_cancelled_litestream_command_does_not_outlive_its_caller(tmp_path: Path) -> None:
    """A bounded `down` cancels a last sync that runs late: the command is killed, not
    left writing the replica after keelway has gone."""
    import asyncio

    from keelway.store import SqliteStore
    from keelway.testing.clock import FakeClock
    from tests.e2e.harness import gone

    pid_file = tmp_path / "pid"
    slow = tmp_path / "litestream"
    slow.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    slow.chmod(0o700)
    store = SqliteStore(tmp_path / "keelway.db", FakeClock())
    replicas = Replicas(store, Home(tmp_path / "home"), None, binary=slow)  # type: ignore[arg-type]

    async def cancel_it() -> None:
        task = asyncio.ensure_future(replicas._litestream("replicate", "-once"))
        while not pid_file.exists() or not pid_file.read_text().strip():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    store.close()
    assert gone(int(pid_file.read_text()), timeout_s=5)
