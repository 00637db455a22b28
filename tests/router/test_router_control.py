"""The control socket: route pushes are validated, persisted, swapped, and survive restarts."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import pytest

from keelway.router.client import (
    RouterRefused,
    RouterUnreachable,
    get_table,
    get_table_sync,
    ping_sync,
    push_table,
)
from keelway.router.route_table import Handling, RouteEntry, RouteTable, decode_table


def serving(upstream: str) -> RouteEntry:
    return RouteEntry(state=Handling.SERVING, upstream=upstream)


def status_for(port: int, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/", headers={"Host": host})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_pushed_table_is_applied_persisted_and_reloaded_after_restart(
    start_router, upstream, tmp_path
) -> None:
    first = start_router()
    assert status_for(first.port, "blog.test") == 404
    assert first.push(3, {"blog.test": serving(upstream.address)}) == 3
    assert status_for(first.port, "blog.test") == 200
    saved = decode_table(first.state.read_bytes())
    assert saved.version == 3
    assert first.stop() == 0

    second = start_router()
    assert second.pid != first.pid
    assert get_table_sync(second.control).version == 3
    assert status_for(second.port, "blog.test") == 200


def test_a_stale_version_is_refused_and_changes_nothing(router, upstream) -> None:
    router.push(5, {"blog.test": serving(upstream.address)})
    with pytest.raises(RouterRefused, match="stale version 4"):
        router.push(4, {})
    assert get_table_sync(router.control).version == 5
    assert decode_table(router.state.read_bytes()).version == 5
    assert status_for(router.port, "blog.test") == 200
    assert router.push(5, {"blog.test": serving(upstream.address)}) == 5  # a republish


def test_bad_json_is_answered_with_an_error_and_the_connection_stays_usable(router) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(router.control))
        sock.sendall(
            b"this is not json\n"
            b'{"op":"set","table":{"version":-1,"routes":{}}}\n'
            b'{"op":"launch"}\n'
            b'{"op":"ping"}\n'
        )
        replies: list[bytes] = []
        deadline = time.monotonic() + 5
        buffer = b""
        while len(replies) < 4 and time.monotonic() < deadline:
            buffer += sock.recv(65536)
            *lines, buffer = buffer.split(b"\n")
            replies += lines
    decoded = [json.loads(line) for line in replies]
    assert [reply["ok"] for reply in decoded] == [False, False, False, True]
    assert all(reply["error"] for reply in decoded[:3])
    assert decoded[3]["pid"] == router.pid
    assert get_table_sync(router.control).version == 0


def _call(router, line: bytes) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(router.control))
        sock.sendall(line + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return json.loads(reply)  # type: ignore[no-any-return]


def test_a_pushed_table_with_bad_entries_applies_the_rest_and_names_each_refused_one(
    router, upstream
) -> None:
    routes = {
        "blog.test": {"state": "serving", "upstream": upstream.address},
        "two.test\n": {"state": "gated"},
        "under_score.test": {"state": "gated"},
        "x.test": {"state": "serving"},
        "y.test": {"state": "serving", "upstream": "127.0.0.1:70000"},
    }
    line = json.dumps({"op": "set", "table": {"version": 4, "routes": routes}}).encode()
    reply = _call(router, line)
    assert reply["ok"] is True and reply["version"] == 4
    refused = reply["refused"]
    assert isinstance(refused, dict)
    assert sorted(refused) == ["two.test\n", "under_score.test", "x.test", "y.test"]
    assert "not a valid hostname" in refused["two.test\n"]
    assert "needs an upstream" in refused["x.test"]
    assert set(get_table_sync(router.control).routes) == {"blog.test"}
    assert set(decode_table(router.state.read_bytes()).routes) == {"blog.test"}
    assert status_for(router.port, "blog.test") == 200
    assert status_for(router.port, "x.test") == 404


def test_a_saved_table_with_entries_todays_rules_refuse_keeps_serving_the_rest(
    start_router, upstream, tmp_path
) -> None:
    state = tmp_path / "routes.json"
    state.write_text(json.dumps({"version": 6, "routes": {
        "blog.test": {"state": "serving", "upstream": upstream.address},
        "under_score.test": {"state": "gated"},  # an older router's rule let this in
        "Bad.Host": {"state": "gated"},
    }}))
    router = start_router(state=state)
    served = get_table_sync(router.control)
    assert served.version == 6 and set(served.routes) == {"blog.test"}
    assert status_for(router.port, "blog.test") == 200
    assert "left out the route for 'under_score.test'" in router.log.read_text()


def test_the_asyncio_client_pushes_and_reads_back(router, upstream) -> None:
    table = RouteTable(version=9, routes={"a.test": serving(upstream.address)})

    async def scenario() -> RouteTable:
        assert await push_table(router.control, table) == 9
        return await get_table(router.control)

    assert asyncio.run(scenario()) == table


def test_a_missing_router_is_reported_as_unreachable_quickly(tmp_path) -> None:
    started = time.monotonic()
    with pytest.raises(RouterUnreachable):
        ping_sync(tmp_path / "nobody.sock", timeout_s=1)
    with pytest.raises(RouterUnreachable):
        asyncio.run(push_table(tmp_path / "nobody.sock", RouteTable(version=1), timeout_s=1))
    assert time.monotonic() - started < 2


def test_a_corrupt_table_file_starts_the_router_with_no_routes(start_router, tmp_path) -> None:
    state = tmp_path / "routes.json"
    state.write_bytes(b'{"version": 2, "routes": {"x.test": {"sta')
    router = start_router(state=state)
    assert get_table_sync(router.control).version == 0
    assert "decode route table" in router.log.read_text()
    assert router.push(1, {}) == 1
    assert decode_table(state.read_bytes()).version == 1
