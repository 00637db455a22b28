"""Publishes share pushes (keelway/deploy/publisher.py `publish`): a cohort publishing
its instances at once costs a few pushes of the whole table, and no caller returns
before a push that began after its call, so what it wrote is in what the router got.
The router's control socket is stood in for by a push that records each table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keelway.deploy import publisher as publishing
from keelway.deploy.errors import RouterUnavailable
from keelway.deploy.publisher import Publisher
from keelway.router.client import Applied, RouterControlError
from keelway.router.route_table import RouteTable
from keelway.store.lifecycle import RouteState
from tests.deploy.conftest import Records

HOSTS = [f"h{i:02}.test" for i in range(40)]


class Router:
    def __init__(self) -> None:
        self.tables: list[RouteTable] = []
        self.fail_next = False

    async def push(self, _sock: object, table: RouteTable, *_: object) -> Applied:
        await asyncio.sleep(0.01)  # a push takes a while: callers pile up meanwhile
        if self.fail_next:
            self.fail_next = False
            raise RouterControlError("the router did not answer")
        self.tables.append(table)
        return Applied(table.version, {})


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Router:
    fake = Router()
    monkeypatch.setattr(publishing, "push_routes", fake.push)
    return fake


def _route(records: Records, host: str) -> None:
    records.instance(host)
    records.store.routes.set_route(host, host, RouteState.SERVING, 8000, None,
                                   expected=records.store.routes.get_route(host))


def test_concurrent_publishes_share_pushes_and_each_sees_what_it_wrote(
        records: Records, router: Router, tmp_path: Path) -> None:
    publisher = Publisher(records.store, tmp_path / "control.sock")

    async def one(host: str) -> tuple[str, int]:
        _route(records, host)  # written before its publish is asked for
        await asyncio.sleep(0)
        return host, await publisher.publish(host)

    async def cohort() -> list[tuple[str, int]]:
        return await asyncio.gather(*(one(h) for h in HOSTS))

    results = asyncio.run(cohort())
    assert len(router.tables) <= 3  # not forty
    for host, version in results:
        pushed = next(t for t in router.tables if t.version == version)
        assert host in pushed.routes  # the push it returned with holds its route


def test_a_failed_push_is_never_the_answer_of_a_caller_that_waited_for_it(
        records: Records, router: Router, tmp_path: Path) -> None:
    publisher = Publisher(records.store, tmp_path / "control.sock")
    _route(records, HOSTS[0])

    async def both() -> list[object]:
        router.fail_next = True
        return await asyncio.gather(publisher.publish(), publisher.publish(),
                                    return_exceptions=True)

    first, second = asyncio.run(both())
    assert isinstance(first, RouterUnavailable)
    # The waiter made a push of its own rather than take the failed one's.
    assert second == router.tables[-1].version and len(router.tables) == 1
