"""The router supervisor on its own, in-process (no daemon, no API): a real router on a
loopback port, killed, and started again on the same held socket by runtime alone."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
from pathlib import Path

from keelway.clock import SystemClock
from keelway.home import Home
from keelway.runtime.router import RouterSettings
from keelway.runtime.router_supervisor import RouterState, RouterSupervisor
from tests.e2e.harness import free_port


def _health_status(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/_keelway/health", headers={"Host": "any.test"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_killed_router_is_started_again_on_its_socket_without_stalling_the_event_loop(
    tmp_path: Path,
) -> None:
    home = Home(tmp_path / "home")
    home.ensure()
    port = free_port()

    async def kill_and_wait_for_the_successor() -> tuple[list[float], str | None]:
        loop = asyncio.get_running_loop()
        supervisor = await RouterSupervisor.boot(home, f"127.0.0.1:{port}",
                                                 RouterSettings(workers=1), SystemClock())
        served = asyncio.Event()

        async def on_serving() -> str | None:
            served.set()
            return None

        supervisor.watch(on_serving)
        gaps: list[float] = []

        async def tick() -> None:
            last = loop.time()
            while True:
                await asyncio.sleep(0.01)
                gaps.append(loop.time() - last)
                last = loop.time()

        ticker = loop.create_task(tick())
        old = supervisor.handle
        try:
            os.kill(old.pid, signal.SIGKILL)
            await asyncio.wait_for(served.wait(), timeout=30)
            health = supervisor.health()
            assert health.state is RouterState.SERVING
            assert health.pid not in (None, old.pid) and health.restarts == 1
            assert await asyncio.to_thread(_health_status, port) == 200
        finally:
            ticker.cancel()
            assert await supervisor.stop(keep_serving=False)
        return gaps, health.last_restart_reason

    gaps, reason = asyncio.run(kill_and_wait_for_the_successor())
    # The death was reaped by the loop (our child: its status is known), and the loop
    # kept turning all along: the spawn, the pings and the records never block it.
    assert reason is not None and "killed by SIGKILL" in reason
    assert max(gaps) < 0.25, f"the event loop stalled for {max(gaps):.3f} s"
