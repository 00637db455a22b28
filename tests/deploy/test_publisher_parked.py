"""A parked route as the router's table carries it."""

from __future__ import annotations

from keelway.deploy.publisher import table_of
from keelway.router import route_table as rt
from keelway.store.lifecycle import RouteState
from keelway.store.records import Route


def test_a_parked_route_is_sent_without_an_upstream_and_is_never_proxied() -> None:
    table, refused = table_of([Route("one.test", "one.test", RouteState.PARKED, None, None,
                                     1)], 1)
    entry = table.routes["one.test"]
    assert refused == {} and entry.upstream is None
    # `parked` where the router knows the word, else `holding` (answered 503 there).
    known = {s.value for s in rt.Handling}
    assert entry.state.value == ("parked" if "parked" in known else "holding")
    assert rt.decide(entry.state) is not rt.Decision.PROXY
