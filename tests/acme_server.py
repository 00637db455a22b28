"""A real ACME server for tests: Debian's `pebble`, with `pebble-challtestsrv` as its DNS
(every name is 127.0.0.1), on loopback ports, its HTTP-01 and TLS-ALPN-01 validations
sent to the ports the test's router listens on. Started per test (a test's router
ports are its own); stopped by pid, proven gone."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tests.e2e.harness import free_port


@dataclass(frozen=True)
class Pebble:
    directory: str  # the ACME directory URL
    ca_bundle: Path  # the root its own HTTPS API is served under
    log: Path


def available() -> bool:
    return shutil.which("pebble") is not None and shutil.which(
        "pebble-challtestsrv") is not None


@contextmanager
def pebble(where: Path, http_port: int, tls_port: int) -> Iterator[Pebble]:
    """A pebble whose validations go to 127.0.0.1:`http_port` (HTTP-01) and `tls_port`
    (TLS-ALPN-01)."""
    if not available():
        pytest.skip("pebble is not installed: apt-get install -y pebble")
    where.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    served = ca.issue_cert("localhost", "127.0.0.1")
    served.private_key_pem.write_to_path(str(where / "key.pem"))
    served.cert_chain_pems[0].write_to_path(str(where / "cert.pem"))
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    api, dns = free_port(), free_port()
    (where / "pebble.json").write_text(json.dumps({"pebble": {
        "listenAddress": f"127.0.0.1:{api}", "managementListenAddress": f"127.0.0.1:{free_port()}",
        "certificate": str(where / "cert.pem"), "privateKey": str(where / "key.pem"),
        "httpPort": http_port, "tlsPort": tls_port, "ocspResponderURL": "",
        "externalAccountBindingRequired": False}}))
    log = where / "pebble.log"
    started: list[subprocess.Popen[bytes]] = []
    try:
        with log.open("ab") as out:
            started.append(subprocess.Popen(
                ["pebble-challtestsrv", "-dns01", f"127.0.0.1:{dns}", "-http01", "",
                 "-https01", "", "-tlsalpn01", "", "-management", f"127.0.0.1:{free_port()}",
                 "-defaultIPv6", ""], stdout=out, stderr=out))
            started.append(subprocess.Popen(
                ["pebble", "-config", str(where / "pebble.json"), "-dnsserver",
                 f"127.0.0.1:{dns}"], stdout=out, stderr=out,
                env={**os.environ, "PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"}))
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", api), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield Pebble(f"https://127.0.0.1:{api}/dir", where / "ca.pem", log)
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            proc.wait(timeout=10)
