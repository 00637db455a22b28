"""The contract of `RouteStore` (store.routes), on every backend."""

from __future__ import annotations

import pytest

from keelway.store import Conflict, Store
from keelway.store.lifecycle import (
    RouteState,
)
from tests.store.contract.conftest import OpenStore
from tests.store.contract.helpers import (
    _gen,
)


def test_the_route_table_version_only_grows_even_across_a_reopen(
    open_store: OpenStore,
) -> None:
    store = open_store()
    first = store.routes.next_route_table_version()
    assert store.routes.next_route_table_version(at_least=first + 10) == first + 11
    assert open_store().routes.next_route_table_version() == first + 12


def test_a_route_is_written_only_over_the_route_the_caller_read(store: Store) -> None:
    gen = _gen(store)
    first = store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4000, gen.id,
                            expected=None)
    with pytest.raises(Conflict):
        store.routes.set_route("a.test", "a.test", RouteState.GATED, None, None, expected=None)
    gated = store.routes.set_route("a.test", "a.test", RouteState.GATED, None, None, expected=first)
    with pytest.raises(Conflict):
        store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4000, gen.id, expected=first)
    assert store.routes.get_route("a.test") == gated
    assert store.routes.list_routes() == [gated]
