"""/metrics's families from one Scrape (keelway/metrics.py), read back with
prometheus-client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from keelway.metrics import (
    INSTANCE_STATES,
    WAKE_BUCKETS_S,
    Histogram,
    InstanceTraffic,
    LastDrill,
    Scrape,
    exposition,
)

BOUNDS = (0.1, 1.0)


def samples(scrape: Scrape) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(exposition(scrape).decode()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def names(scrape: Scrape) -> set[str]:
    return {f.name for f in text_string_to_metric_families(exposition(scrape).decode())}


TRAFFIC = (
    InstanceTraffic("shop", "a.shop", {("app", "2xx"): 5, ("router", "5xx"): 1}, 2,
                    Histogram(BOUNDS, (3, 5), 6, 1.5)),
    InstanceTraffic("shop", "b.shop", {("app", "2xx"): 2}, 1,
                    Histogram(BOUNDS, (1, 2), 2, 0.5)),
    InstanceTraffic("blog", "blog.test", {("app", "4xx"): 3}),
)
FULL = Scrape(
    per_instance=False, traffic=TRAFFIC, router_started_at=1700000000.0,
    states=(("shop", "a.shop", "running"), ("shop", "b.shop", "parked"),
            ("blog", "blog.test", "crashed")),
    operations=(("shop", "wake", "succeeded", 4), ("shop", "deploy", "failed", 1)),
    wakes={"shop": Histogram(WAKE_BUCKETS_S, (0, 1, 2, 3, 4, 4, 4, 4, 4, 4), 4, 1.2)},
    rollouts=(("shop", "done", 2),),
    drills=(LastDrill("shop", "a.shop", True, 1.0), LastDrill("shop", "b.shop", False, 2.0)))


def test_by_default_every_per_instance_figure_is_summed_per_app() -> None:
    got = samples(FULL)
    assert got[("keelway_http_requests_total",
                (("app", "shop"), ("class", "2xx"), ("source", "app")))] == 7
    assert got[("keelway_http_requests_total",
                (("app", "shop"), ("class", "5xx"), ("source", "router")))] == 1
    assert got[("keelway_http_requests_total",
                (("app", "blog"), ("class", "4xx"), ("source", "app")))] == 3
    assert got[("keelway_http_requests_in_flight", (("app", "shop"),))] == 3
    assert got[("keelway_http_request_duration_seconds_bucket",
                (("app", "shop"), ("le", "0.1")))] == 4
    assert got[("keelway_http_request_duration_seconds_bucket",
                (("app", "shop"), ("le", "+Inf")))] == 8
    assert got[("keelway_http_request_duration_seconds_sum", (("app", "shop"),))] == 2.0
    assert got[("keelway_restore_drill_last", (("app", "shop"), ("result", "failed")))] == 1
    assert not any(("instance", "a.shop") in labels for _, labels in got)


def test_per_instance_series_name_each_instance() -> None:
    got = samples(Scrape(**{**FULL.__dict__, "per_instance": True}))
    assert got[("keelway_http_requests_total", (("app", "shop"), ("class", "2xx"),
                                                ("instance", "a.shop"), ("source", "app")))] == 5
    assert got[("keelway_instance_state", (("app", "shop"), ("instance", "b.shop"),
                                           ("state", "parked")))] == 1
    assert got[("keelway_restore_drill_last_timestamp_seconds",
                (("app", "shop"), ("instance", "b.shop")))] == 2.0


def test_every_state_is_answered_for_every_app_even_at_zero() -> None:
    got = samples(FULL)
    for app in ("shop", "blog"):
        assert {state for (name, labels) in got if name == "keelway_instances"
                and ("app", app) in labels for _, state in [labels[1]]} == set(INSTANCE_STATES)
    assert got[("keelway_instances", (("app", "shop"), ("state", "parked")))] == 1
    assert got[("keelway_instances", (("app", "shop"), ("state", "crashed")))] == 0


def test_the_journals_counts_and_the_wake_histogram_are_answered_as_given() -> None:
    got = samples(FULL)
    assert got[("keelway_operations_total", (("app", "shop"), ("kind", "wake"),
                                             ("outcome", "succeeded")))] == 4
    assert got[("keelway_rollouts_total", (("app", "shop"), ("state", "done")))] == 2
    assert got[("keelway_wake_duration_seconds_bucket", (("app", "shop"), ("le", "0.1")))] == 1
    assert got[("keelway_wake_duration_seconds_bucket", (("app", "shop"), ("le", "+Inf")))] == 4
    assert got[("keelway_wake_duration_seconds_count", (("app", "shop"),))] == 4


def test_a_router_that_did_not_answer_leaves_its_families_out_rather_than_at_zero() -> None:
    down = Scrape(per_instance=False, traffic=None, states=FULL.states)
    assert samples(down)[("keelway_router_up", ())] == 0
    assert "keelway_http_requests" not in names(down)
    assert "keelway_instances" in names(down)
    assert samples(FULL)[("keelway_router_up", ())] == 1
    assert samples(FULL)[("keelway_router_start_time_seconds", ())] == 1700000000.0


def test_label_values_a_tenant_chooses_are_escaped_not_trusted() -> None:
    odd = Scrape(per_instance=True, traffic=(
        InstanceTraffic('we"ird\napp', "x.test", {("app", "2xx"): 1}),))
    got = samples(odd)
    assert got[("keelway_http_requests_total", (("app", 'we"ird\napp'), ("class", "2xx"),
                                                ("instance", "x.test"),
                                                ("source", "app")))] == 1
