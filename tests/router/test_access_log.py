"""The router's access log, written by real router processes for real requests: one
line per answered request in the instance's file, the query string never in it, a held
request's wait for its parked instance said, lines kept by the next router on the same
file, and the line format read back by the time it carries."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from keelway.router.access_log import (
    ACCESS_LOG_NAME,
    AccessLog,
    line_time,
    path_of,
    read_lines,
)
from keelway.router.route_table import Handling, RouteEntry, RouteTable
from keelway.runtime.logs import rotate_if_large
from tests.router.conftest import RouterProcess, Upstream
from tests.router.test_router_wake import FakeControlPlane, fetch, wait_for

HOST = "blog.test"


def serving(upstream: Upstream, generation: int | None = 7) -> dict[str, RouteEntry]:
    return {HOST: RouteEntry(state=Handling.SERVING, upstream=upstream.address,
                             generation=generation)}


def lines_of(logs: Path, instance: str = HOST) -> list[str]:
    return [text for _, text in read_lines(logs / instance / ACCESS_LOG_NAME)[0]]


def get(port: int, target: str, host: str = HOST) -> bytes:
    return fetch(port, f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                 .encode())


def fields(line: str) -> list[str]:
    return line.split(" ")


def test_a_proxied_request_is_one_line_with_its_path_status_bytes_and_generation_and_no_query(
        start_router: type[RouterProcess], upstream: Upstream, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    router = start_router(extra_argv=("--access-log", str(logs)))
    router.push(1, serving(upstream))
    before = time.time()
    reply = get(router.port, "/hop?token=s3cret&x=1")
    assert reply.startswith(b"HTTP/1.1 200")
    wait_for(lambda: len(lines_of(logs)) == 1, timeout_s=10)
    (line,) = lines_of(logs)
    _at, client, method, path, status, sent, took, gen, held = fields(line)
    assert "s3cret" not in line and "?" not in line
    assert (client, method, path, status, gen, held) == (
        "127.0.0.1", "GET", "/hop", "200", "gen=7", "held=-")
    assert int(sent) == len(reply)  # head and body, as the client got them
    assert took.endswith("ms") and float(took[:-2]) >= 0
    stamped = line_time(line)
    assert stamped is not None and before - 1 <= stamped <= time.time() + 1
    assert (logs / HOST / ACCESS_LOG_NAME).stat().st_mode & 0o777 == 0o600


def test_the_routers_own_answers_are_logged_and_unrouted_hosts_are_not(
        start_router: type[RouterProcess], upstream: Upstream, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    router = start_router(extra_argv=("--access-log", str(logs), "--workers", "2"))
    router.push(1, {HOST: RouteEntry(state=Handling.STOPPED)})
    assert get(router.port, "/a").startswith(b"HTTP/1.1 503")
    assert get(router.port, "/", host="nobody.test").startswith(b"HTTP/1.1 404")
    wait_for(lambda: len(lines_of(logs)) == 1, timeout_s=10)
    assert fields(lines_of(logs)[0])[3:5] == ["/a", "503"]
    assert fields(lines_of(logs)[0])[7] == "gen=-"
    assert not (logs / "nobody.test").exists()


def test_a_held_request_says_how_long_it_waited_for_its_parked_instance_to_wake(
        start_router: type[RouterProcess], upstream: Upstream, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    api = tmp_path / "api.sock"
    router_box: list[RouterProcess] = []

    def wake(_line: str) -> None:
        # The instance takes a moment to come up, then its serving table is pushed.
        def later() -> None:
            time.sleep(0.4)
            router_box[0].push(2, serving(upstream, generation=9))
        threading.Thread(target=later).start()

    cp = FakeControlPlane(api, on_wake=wake)
    try:
        router = start_router(extra_argv=("--access-log", str(logs), "--wake-socket", str(api),
                                          "--hold-timeout=20", "--workers", "2"))
        router_box.append(router)
        router.push(1, {HOST: RouteEntry(state=Handling.PARKED)})
        assert get(router.port, "/woken?q=1").startswith(b"HTTP/1.1 200")
        wait_for(lambda: len(lines_of(logs)) == 1, timeout_s=10)
        line = lines_of(logs)[0]
        _at, _client, _method, path, status, _sent, took, gen, held = fields(line)
        assert (path, status, gen) == ("/woken", "200", "gen=9")
        held_ms = float(held.removeprefix("held=").removesuffix("ms"))
        assert 300 <= held_ms <= 15_000
        assert float(took[:-2]) >= held_ms
    finally:
        cp.stop()


@pytest.mark.slow
def test_the_file_is_appended_across_a_router_restart_and_rotated_in_place(
        start_router: type[RouterProcess], upstream: Upstream, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = start_router(extra_argv=("--access-log", str(logs), "--workers", "2"))
    first.push(1, serving(upstream))
    for n in range(5):
        get(first.port, f"/first/{n}")
    assert first.stop() == 0  # a drain writes what is pending
    assert len(lines_of(logs)) == 5
    second = start_router(extra_argv=("--access-log", str(logs)))
    second.push(2, serving(upstream, generation=8))
    path = logs / HOST / ACCESS_LOG_NAME
    assert rotate_if_large(path, max_bytes=10)  # the control plane's rule, copytruncate
    for n in range(3):
        get(second.port, f"/second/{n}")
    wait_for(lambda: len(lines_of(logs)) == 3, timeout_s=10)
    assert [fields(line)[3] for line in lines_of(logs)] == [f"/second/{n}" for n in range(3)]
    rotated = [text for _, text in read_lines(path.with_name(f"{ACCESS_LOG_NAME}.1"))[0]]
    # Two workers' batches: in time order per batch only (readers sort by time).
    assert sorted(fields(line)[3] for line in rotated) == [f"/first/{n}" for n in range(5)]


def test_many_workers_interleave_only_between_whole_lines(
        start_router: type[RouterProcess], upstream: Upstream, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    router = start_router(extra_argv=("--access-log", str(logs), "--workers", "3"))
    router.push(1, serving(upstream))
    per_thread = 40

    def hammer(k: int) -> None:
        for n in range(per_thread):
            get(router.port, f"/t{k}/{n}")

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    wait_for(lambda: len(lines_of(logs)) == 4 * per_thread, timeout_s=15)
    paths = sorted(fields(line)[3] for line in lines_of(logs))
    assert paths == sorted(f"/t{k}/{n}" for k in range(4) for n in range(per_thread))
    assert all(len(fields(line)) == 9 and line_time(line) for line in lines_of(logs))


def test_a_client_that_leaves_before_its_answer_is_logged_499(
        start_router: type[RouterProcess], upstream: Upstream, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    router = start_router(extra_argv=("--access-log", str(logs)))
    router.push(1, serving(upstream))
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(f"GET /slow HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        time.sleep(0.1)
        # A reset, not a half-close (after which the answer is still owed and sent).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_for(lambda: len(lines_of(logs)) == 1, timeout_s=10)
    assert fields(lines_of(logs)[0])[3:5] == ["/slow", "499"]


def test_a_path_is_written_as_one_line_of_ascii_without_its_query() -> None:
    assert path_of(b"/a b\n\xff?x=1") == "/a%20b%0A%FF"
    assert path_of(b"/plain") == "/plain"
    assert path_of(b"?only=query") == "-"


def test_a_batch_the_disk_refuses_is_dropped_and_counted(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    log = AccessLog(blocked)
    log.pending += (HOST, None, 1.0, 2.0, b"GET", b"/", 200, 10, -1.0, b"127.0.0.1")
    log.flush()  # ENOTDIR under a file: never raised to the request path
    assert log.dropped == 1 and log.pending == []


def test_a_lines_time_reads_back_as_written() -> None:
    log_line = "2025-05-01T12:00:00.250Z 1.2.3.4 GET / 200 1 0.1ms gen=- held=-"
    assert line_time(log_line) == 1746100800.25
    assert line_time("no time here") is None


def test_an_unused_table_entry_generation_is_left_out_of_the_encoding() -> None:
    from keelway.router.route_table import encode_table
    table = RouteTable(version=1, routes={HOST: RouteEntry(state=Handling.STOPPED)})
    assert b"generation" not in encode_table(table)
