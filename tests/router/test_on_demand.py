"""Certificate demands (keelway/router/on_demand.py) with the call to the control plane
and the clock replaced: one request per name however many wait, none for a name the
table does not serve, and after a failure none until the hold-off has passed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keelway.router.on_demand import FAILED_HOLDOFF_S, ON_DEMAND_WAIT_S, OnDemand
from keelway.router.server import parse_args

pytestmark = pytest.mark.timeout(10)


class _ControlPlane:
    def __init__(self, status: int) -> None:
        self.status = status
        self.asked: list[tuple[str, float]] = []
        self.release = asyncio.Event()

    async def post(self, _socket: Path, path: str, timeout_s: float
                   ) -> tuple[int, int | None]:
        self.asked.append((path, timeout_s))
        await self.release.wait()
        return self.status, None


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _demands(plane: _ControlPlane, clock: _Clock) -> OnDemand:
    return OnDemand(Path("/nowhere"), lambda name: name.endswith(".served"), clock,
                    plane.post)


def test_every_wait_for_one_name_shares_one_request() -> None:
    async def run() -> None:
        plane = _ControlPlane(200)
        demands = _demands(plane, _Clock())
        answers = [demands.ask("a.served") for _ in range(5)]
        assert all(a is answers[0] for a in answers)
        await asyncio.sleep(0)
        plane.release.set()
        assert await asyncio.gather(*(a for a in answers if a is not None)) == [True] * 5
        assert plane.asked == [("/v1/certs/a.served/demand", ON_DEMAND_WAIT_S)]

    asyncio.run(run())


def test_a_name_not_served_is_never_asked_for() -> None:
    async def run() -> None:
        plane = _ControlPlane(200)
        demands = _demands(plane, _Clock())
        assert demands.ask("evil.test") is None
        await asyncio.sleep(0)
        assert plane.asked == []

    asyncio.run(run())


def test_after_a_failure_a_name_is_refused_at_once_until_the_hold_off_ends() -> None:
    async def run() -> None:
        plane = _ControlPlane(503)
        clock = _Clock()
        demands = _demands(plane, clock)
        plane.release.set()
        answer = demands.ask("a.served")
        assert answer is not None and await answer is False
        clock.now += FAILED_HOLDOFF_S - 0.1
        assert demands.ask("a.served") is None
        other = demands.ask("b.served")  # another name is its own
        assert other is not None and await other is False
        clock.now += 0.2
        again = demands.ask("a.served")
        assert again is not None and await again is False
        assert [path for path, _ in plane.asked] == [
            "/v1/certs/a.served/demand", "/v1/certs/b.served/demand",
            "/v1/certs/a.served/demand"]

    asyncio.run(run())


def test_closing_answers_every_wait_with_no() -> None:
    async def run() -> None:
        plane = _ControlPlane(200)
        demands = _demands(plane, _Clock())
        answer = demands.ask("a.served")
        await asyncio.sleep(0)
        demands.close()
        assert answer is not None and await answer is False
        await asyncio.sleep(0)

    asyncio.run(run())


def test_on_demand_needs_the_control_planes_socket_and_a_store() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--listen", "127.0.0.1:1", "--certs", "/c", "--on-demand"])
    with pytest.raises(SystemExit):
        parse_args(["--listen", "127.0.0.1:1", "--wake-socket", "/s", "--on-demand"])
    config = parse_args(["--listen", "127.0.0.1:1", "--certs", "/c", "--wake-socket", "/s",
                         "--on-demand"])
    assert config.on_demand and config.wake_socket == Path("/s")
    assert not parse_args(["--listen", "127.0.0.1:1"]).on_demand
