"""What the published table says of each host, from records alone (publisher.table_of):
aliases name their instance, and a route the store gates says why."""

from __future__ import annotations

from keelway.deploy.publisher import HttpPolicy, Standing, table_of
from keelway.router import route_table as rt
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.store.records import Route


def _row(host: str, instance: str, state: RouteState, port: int | None = None) -> Route:
    return Route(host, instance, state, port, 1 if port else None, 1)


def test_an_alias_names_its_instance_and_a_primary_host_names_nothing_new() -> None:
    table, refused = table_of([_row("one.test", "one.test", RouteState.PARKED),
                               _row("www.one.test", "one.test", RouteState.PARKED)], 1)
    assert refused == {}
    assert table.routes["one.test"] == rt.RouteEntry(rt.Handling.PARKED)
    assert table.routes["www.one.test"] == rt.RouteEntry(rt.Handling.PARKED,
                                                     instance="one.test")


def test_a_gated_route_says_stopped_crashed_not_deployed_or_gated() -> None:
    rows = [_row(h, h, RouteState.GATED) for h in
            ("stopped.test", "removing.test", "crashed.test", "fresh.test", "fenced.test")]
    standings = {
        "stopped.test": Standing(InstanceState.STOPPED),
        "removing.test": Standing(InstanceState.RUNNING, removing=True),
        "crashed.test": Standing(InstanceState.RUNNING),
        "fresh.test": Standing(InstanceState.RUNNING, deployed=False),
        "fenced.test": Standing(InstanceState.RUNNING),
    }
    table, _ = table_of(rows, 1, {"crashed.test": 41.2}, standings)
    said = {h: (r.state, r.retry_after_s) for h, r in table.routes.items()}
    assert said == {
        "stopped.test": (rt.Handling.STOPPED, 5),
        "removing.test": (rt.Handling.STOPPED, 5),
        "crashed.test": (rt.Handling.CRASHED, 42),
        "fresh.test": (rt.Handling.NO_RELEASE, 5),
        "fenced.test": (rt.Handling.GATED, 5),
    }


def test_an_instance_without_a_route_row_says_not_deployed_at_every_host() -> None:
    standings = {"fresh.test": Standing(InstanceState.RUNNING, deployed=False,
                                        aliases=("www.fresh.test",)),
                 "off.test": Standing(InstanceState.STOPPED, deployed=False),
                 "workers.test": Standing(InstanceState.RUNNING)}  # no web: no page
    table, _ = table_of([], 1, None, standings)
    assert table.routes == {
        "fresh.test": rt.RouteEntry(rt.Handling.NO_RELEASE),
        "www.fresh.test": rt.RouteEntry(rt.Handling.NO_RELEASE, instance="fresh.test"),
        "off.test": rt.RouteEntry(rt.Handling.STOPPED),
    }


def test_an_instances_http_policy_reaches_every_host_of_it() -> None:
    policy = HttpPolicy(max_concurrency=7, force_https=True, hsts_s=600)
    table, _ = table_of([_row("one.test", "one.test", RouteState.SERVING, 4000),
                         _row("www.one.test", "one.test", RouteState.SERVING, 4000),
                         _row("two.test", "two.test", RouteState.SERVING, 4001)], 1,
                        policies={"one.test": policy})
    for host in ("one.test", "www.one.test"):
        entry = table.routes[host]
        assert (entry.max_concurrency, entry.force_https, entry.hsts_s) == (7, True, 600)
    other = table.routes["two.test"]
    assert (other.max_concurrency, other.force_https, other.hsts_s) == (None, False, None)
