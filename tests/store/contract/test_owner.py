"""The owner's lease, on every backend: a handle writes as the owner it was opened by;
once another owner has opened the store (taken its lease), every write of the first is
refused (`StaleOwner`) and changes nothing. One box has one token, so its handles never
refuse each other. The seam a fleet's lease uses (SPEC §8)."""

from __future__ import annotations

import pytest

from keelway.journal import OpKind
from keelway.store import StaleOwner
from tests.store.contract.conftest import OpenStore
from tests.store.contract.helpers import (
    RETIRING,
    _everything,
    _running,
)


def test_a_write_by_an_owner_whose_lease_another_took_is_refused_and_changes_nothing(
        open_store: OpenStore) -> None:
    stale = open_store()
    web = _running(stale)
    rev = stale.instances.bump_schedule("a.test")
    taker = open_store(owner="box:elsewhere")
    before = _everything(taker)
    writes = [
        lambda: stale.apps.ensure_app("shop"),
        lambda: stale.instances.fence("a.test", "stale"),
        lambda: stale.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me"),
        lambda: stale.routes.next_route_table_version(),
        lambda: stale.record_gone(web.id, 0),
        lambda: stale.local.record_process(web.id, 1, 1),
        lambda: stale.local.free_port(web.id),
        lambda: stale.install("a.test", schedule_rev=rev, candidates={"web": web},
                              retiring=[], retire_reason=RETIRING, op_id=1, release=None),
    ]
    for write in writes:
        with pytest.raises(StaleOwner, match="box:elsewhere"):
            write()
    assert _everything(taker) == before
    # Reads are not refused, and the lease's holder writes.
    assert stale.apps.get_app("blog") is not None
    assert taker.apps.ensure_app("shop").name == "shop"


def test_handles_of_one_box_share_its_token_and_never_refuse_each_other(
        open_store: OpenStore) -> None:
    first = open_store()
    second = open_store()
    first.apps.ensure_app("blog")
    second.apps.ensure_app("shop")
    assert [a.name for a in first.apps.list_apps()] == ["blog", "shop"]


def test_an_owner_that_takes_the_lease_back_writes_again(open_store: OpenStore) -> None:
    mine = open_store(owner="box:a")
    open_store(owner="box:b")
    with pytest.raises(StaleOwner):
        mine.apps.ensure_app("blog")
    again = open_store(owner="box:a")
    assert again.apps.ensure_app("blog").name == "blog"
    assert mine.apps.get_app("blog") is not None
