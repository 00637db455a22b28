"""The upstream pool's bookkeeping, without sockets: reuse order and idle expiry."""

from __future__ import annotations

import asyncio

import pytest

from keelway.router import upstream
from keelway.router.upstream import UpstreamConnection, UpstreamPool


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def connection(pool: UpstreamPool) -> tuple[UpstreamConnection, Transport]:
    conn = UpstreamConnection(pool)
    transport = Transport()
    conn.connection_made(transport)
    return conn, transport


def test_idle_connections_expire_by_the_sweep_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle age is read from a clock the sweep advances (the hot path reads no clock):
    a connection is kept while younger than the limit and closed by the first sweep
    after it, and the most recently released one is reused first."""
    now = [1000.0]
    monkeypatch.setattr(upstream.time, "monotonic", lambda: now[0])
    pool = UpstreamPool("127.0.0.1", 9, "127.0.0.1:9", max_idle=8, connect_timeout_s=1)
    older, older_transport = connection(pool)
    newer, newer_transport = connection(pool)
    pool.release(older)
    now[0] += 29
    pool.sweep(idle_limit_s=30)  # older is 29 s idle: kept
    pool.release(newer)  # released at the sweep clock, 1029
    assert not older_transport.closed
    now[0] += 2
    pool.sweep(idle_limit_s=30)  # 1031: older is 31 s idle, newer 2 s
    assert older_transport.closed
    assert not newer_transport.closed
    assert pool.acquire() is newer
    assert pool.acquire() is None
