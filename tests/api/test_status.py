"""What `status` and `instances list` answer (keelway/api/status.py), daemon-less over
each store backend: every instance counted whatever the page, a page of views plus the
ones that need attention, every instance whole without a page, and a read whose number
of queries does not grow with the number of instances."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keelway.api.status import Page, Seen, instances_json, status_view
from keelway.deploy.errors import UserError
from keelway.store import Store
from keelway.store.sqlite import SqliteStore
from keelway.testing.clock import FakeClock
from keelway.testing.memory_store import MemoryStore

APP = "shop"


def _hosts(count: int) -> list[str]:
    return [f"t{n:03d}.shop.test" for n in range(count)]


@pytest.fixture(params=["sqlite", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    found: Store = (SqliteStore(tmp_path / "keelway.db", FakeClock())
                    if request.param == "sqlite" else MemoryStore(FakeClock()))
    yield found
    found.close()


def _fleet(store: Store, count: int, fenced: tuple[str, ...] = ()) -> list[str]:
    hosts = _hosts(count)
    store.apps.create_app(APP)
    store.instances.add_instances(APP, hosts, {}, parked=True)
    for host in fenced:
        store.instances.fence(host, "maintenance")
    return hosts


def _status(store: Store, page: Page | None = None) -> dict[str, Any]:
    (app,) = status_view(store, Seen.read(8080, set(), None), APP, page)["apps"]
    return app  # type: ignore[no-any-return]


def test_a_page_holds_its_instances_and_the_summary_counts_every_one(store: Store) -> None:
    hosts = _fleet(store, 45, fenced=("t044.shop.test", "t001.shop.test"))
    app = _status(store, Page(2, 20))
    assert [i["host"] for i in app["instances"]] == hosts[20:40]
    assert app["page"] == {"number": 2, "size": 20, "pages": 3, "total": 45}
    assert app["summary"] == {"instances": 45, "states": {"no release": 45}, "releases": {},
                              "attention": 2}
    # Whichever page their rows are on, in the store's order.
    assert [(i["host"], i["attention"]) for i in app["attention"]] == [
        ("t001.shop.test", ["fenced"]), ("t044.shop.test", ["fenced"])]


def test_without_a_page_every_instance_is_shown_whole(store: Store) -> None:
    hosts = _fleet(store, 45, fenced=("t044.shop.test",))
    app = _status(store)
    assert [i["host"] for i in app["instances"]] == hosts
    assert "page" not in app and "attention" not in app
    assert app["instances"][-1]["fence"] == {"generation": 1, "held": True,
                                             "reason": "maintenance"}
    assert app["summary"]["attention"] == 1


def test_the_attention_a_paged_answer_carries_is_at_most_a_page(store: Store) -> None:
    hosts = _fleet(store, 30, fenced=tuple(_hosts(30)))
    app = _status(store, Page(1, 5))
    assert [i["host"] for i in app["attention"]] == hosts[:5]
    assert app["summary"]["attention"] == 30


def test_instances_list_pages_as_status_does(store: Store) -> None:
    hosts = _fleet(store, 25, fenced=("t024.shop.test",))
    listed = json.loads(instances_json(store, APP, None, Page(2, 20)))
    assert [i["host"] for i in listed["instances"]] == hosts[20:]
    assert listed["attention"] == [{"host": "t024.shop.test", "attention": ["fenced"]}]
    assert listed["summary"]["instances"] == 25
    every = json.loads(instances_json(store, APP, None))
    assert [i["host"] for i in every["instances"]] == hosts and "page" not in every


@pytest.mark.parametrize(("number", "size"), [("0", None), ("x", None), ("1", "0"),
                                              (None, "-3"), ("1.5", None)])
def test_a_bad_page_is_refused_by_name(number: str | None, size: str | None) -> None:
    with pytest.raises(UserError, match="page must be a whole number"):
        Page.parse(number, size)


def test_no_page_asked_is_every_instance() -> None:
    assert Page.parse(None, None) is None
    assert Page.parse("3", None) == Page(3, 20)
    assert Page.parse(None, "50") == Page(1, 50)


def _queries(tmp_path: Path, count: int, page: Page | None) -> int:
    store = SqliteStore(tmp_path / f"{count}.db", FakeClock())
    try:
        _fleet(store, count, fenced=tuple(_hosts(count)[:3]))
        made: list[str] = []
        store.db._conn.set_trace_callback(made.append)
        _status(store, page)
        json.loads(instances_json(store, APP, None, page))
        return len(made)
    finally:
        store.close()


@pytest.mark.parametrize("page", [None, Page(1)])
def test_status_reads_every_instance_in_as_many_queries_as_it_reads_a_few(
        tmp_path: Path, page: Page | None) -> None:
    assert _queries(tmp_path, 300, page) == _queries(tmp_path, 30, page)
