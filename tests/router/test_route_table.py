"""The route table as data: format, validation, host matching. No I/O."""

from __future__ import annotations

import msgspec
import pytest

from keelway.router.route_table import (
    Handling,
    RouteEntry,
    RouteTable,
    Routing,
    decode_table,
    encode_table,
    host_key,
)

WIRE = (
    b'{"version": 7, "routes": {"blog.test": {"state": "serving", '
    b'"upstream": "127.0.0.1:34567", "retry_after_s": 5}}}'
)


def test_the_documented_wire_format_decodes_and_round_trips() -> None:
    table = decode_table(WIRE)
    assert table.version == 7
    assert table.routes["blog.test"] == RouteEntry(Handling.SERVING, "127.0.0.1:34567", 5)
    assert decode_table(encode_table(table)) == table


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b"blog.test", b"blog.test"),
        (b"Blog.TEST", b"blog.test"),
        (b"blog.test:8080", b"blog.test"),
        (b"BLOG.test.:80", b"blog.test"),
        (b"[::1]:8080", b"[::1]"),
    ],
)
def test_host_keys_ignore_case_port_and_trailing_dot(raw: bytes, key: bytes) -> None:
    assert host_key(raw) == key


def test_lookup_matches_any_spelling_of_a_routed_host() -> None:
    routing = Routing(decode_table(WIRE))
    for raw in (b"blog.test", b"BLOG.test:80", b"blog.test."):
        target = routing.lookup(raw)
        assert target is not None
        assert (target.upstream_host, target.upstream_port) == ("127.0.0.1", 34567)
    assert routing.lookup(b"other.test") is None


def test_gated_and_holding_routes_are_not_proxied_serving_and_draining_are() -> None:
    table = RouteTable(
        version=1,
        routes={
            "a.test": RouteEntry(Handling.SERVING, "127.0.0.1:1"),
            "b.test": RouteEntry(Handling.DRAINING, "127.0.0.1:2"),
            "c.test": RouteEntry(Handling.GATED, retry_after_s=9),
            "d.test": RouteEntry(Handling.HOLDING),
        },
    )
    routing = Routing(table)
    proxied = {h: routing.lookup(h.encode()).proxied for h in table.routes}  # type: ignore[union-attr]
    assert proxied == {"a.test": True, "b.test": True, "c.test": False, "d.test": False}


@pytest.mark.parametrize(
    "bad",
    [
        b'{"version": -1, "routes": {}}',
        b'{"version": 1, "routes": {"Blog.test": {"state": "gated"}}}',
        b'{"version": 1, "routes": {"blog.test:80": {"state": "gated"}}}',
        b'{"version": 1, "routes": {"blog.test": {"state": "serving"}}}',
        b'{"version": 1, "routes": {"blog.test": {"state": "serving", "upstream": "nope"}}}',
        b'{"version": 1, "routes": {"b.test": {"state": "serving", "upstream": "h:70000"}}}',
        b'{"version": 1, "routes": {"blog.test": {"state": "asleep"}}}',
        b'{"version": 1, "routes": {"blog.test": {"state": "gated", "retry_after_s": -3}}}',
        b'{"version": 1, "routes": {}, "extra": 1}',
        b"not json",
    ],
)
def test_invalid_tables_are_refused_with_a_reason(bad: bytes) -> None:
    with pytest.raises(msgspec.DecodeError) as info:
        decode_table(bad)
    assert str(info.value)


def test_a_table_cannot_be_constructed_invalid_either() -> None:
    with pytest.raises(ValueError, match="needs an upstream"):
        RouteEntry(Handling.SERVING)


class _RouteOfFormat1(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A route as a router of table format 1 decoded it: no `instance`, five states."""

    state: str
    upstream: str | None = None
    retry_after_s: int = 5

    def __post_init__(self) -> None:
        if self.state not in ("serving", "gated", "holding", "draining", "parked"):
            raise ValueError(f"unknown state {self.state}")


def test_a_table_of_the_format_before_reads_with_each_host_its_own_instance() -> None:
    table = decode_table(
        b'{"version": 3, "routes": {"blog.test": {"state": "parked", "retry_after_s": 5},'
        b' "www.blog.test": {"state": "parked", "retry_after_s": 5}}}')
    routing = Routing(table)
    assert {t.host: t.instance for t in routing.by_host.values()} == {
        "blog.test": "blog.test", "www.blog.test": "www.blog.test"}
    assert routing.parked == {"blog.test", "www.blog.test"}


def test_an_alias_route_names_its_instance_and_wakes_and_counts_as_it() -> None:
    table = RouteTable(version=1, routes={
        "blog.test": RouteEntry(Handling.PARKED),
        "www.blog.test": RouteEntry(Handling.PARKED, instance="blog.test")})
    assert decode_table(encode_table(table)) == table
    routing = Routing(table)
    assert routing.instances == routing.parked == {"blog.test"}
    assert routing.lookup(b"WWW.blog.test:8080").instance == "blog.test"  # type: ignore[union-attr]
    with pytest.raises(msgspec.DecodeError):
        decode_table(b'{"version": 1, "routes": {"www.blog.test": {"state": "parked",'
                     b' "instance": "Blog_Test"}}}')


def test_a_table_that_uses_nothing_new_is_read_by_a_router_of_the_format_before() -> None:
    table = RouteTable(version=1, routes={
        "a.test": RouteEntry(Handling.SERVING, "127.0.0.1:1"),
        "b.test": RouteEntry(Handling.GATED, retry_after_s=9),
        "c.test": RouteEntry(Handling.PARKED)})
    old = msgspec.json.decode(encode_table(table), type=dict[str, object])
    routes = msgspec.convert(old["routes"], dict[str, _RouteOfFormat1])
    assert {h: r.state for h, r in routes.items()} == {
        "a.test": "serving", "b.test": "gated", "c.test": "parked"}


@pytest.mark.parametrize("state", [Handling.STOPPED, Handling.NO_RELEASE,
                                   Handling.CRASHED])
def test_the_states_of_format_2_answer_at_once_and_hold_nothing(state: Handling) -> None:
    target = Routing(RouteTable(version=1, routes={"a.test": RouteEntry(state)})).lookup(b"a.test")
    assert target is not None and not target.proxied and not target.holding


def test_a_table_without_max_concurrency_reads_as_before_and_leaves_it_to_the_router() -> None:
    table = decode_table(WIRE)  # written before routes could name a bound
    assert table.routes["blog.test"].max_concurrency is None
    assert Routing(table).max_concurrency == {}  # every instance: the router's default
    # and a table that names none reads in a router of the format before
    assert b"max_concurrency" not in encode_table(table)


def test_an_instance_is_bounded_by_the_smallest_max_concurrency_its_routes_name() -> None:
    table = RouteTable(version=1, routes={
        "a.test": RouteEntry(Handling.SERVING, "127.0.0.1:1", max_concurrency=20),
        "www.a.test": RouteEntry(Handling.SERVING, "127.0.0.1:1", instance="a.test",
                                 max_concurrency=5),
        "b.test": RouteEntry(Handling.SERVING, "127.0.0.1:2"),
        "www.b.test": RouteEntry(Handling.SERVING, "127.0.0.1:2", instance="b.test",
                                 max_concurrency=7),
        "c.test": RouteEntry(Handling.SERVING, "127.0.0.1:3")})
    assert decode_table(encode_table(table)) == table
    assert Routing(table).max_concurrency == {"a.test": 5, "b.test": 7}
    with pytest.raises(msgspec.DecodeError, match="max_concurrency"):
        decode_table(b'{"version": 1, "routes": {"a.test": {"state": "serving", '
                     b'"upstream": "127.0.0.1:1", "max_concurrency": 0}}}')
