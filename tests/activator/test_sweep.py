"""The idle sweep's decision, from values alone, and its client against an older router."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest

from keelway.activator.activity import Activity, ActivityUnknown, fetch_activity
from keelway.activator.sweep import Awake, Verb, idle_after_s, to_act, to_park
from keelway.builds.manifest import Manifest, Mode, ServiceKind, ServiceSpec


def spec(name: str, idle_s: float | None) -> ServiceSpec:
    kind = ServiceKind.WEB if name == "web" else ServiceKind.WORKER
    return ServiceSpec(name, "python3 app.py", kind, Mode.OVERLAP, idle_s=idle_s)


def test_the_bound_is_the_smallest_idle_its_services_declare() -> None:
    manifest = Manifest({"web": spec("web", 900.0), "worker": spec("worker", 60.0)})
    assert idle_after_s(manifest) == 60.0


def test_one_service_without_idle_keeps_the_whole_instance_awake() -> None:
    manifest = Manifest({"web": spec("web", 60.0), "worker": spec("worker", None)})
    assert idle_after_s(manifest) is None


def test_an_instance_without_a_web_is_never_parked_there_is_no_request_to_wake_it() -> None:
    assert idle_after_s(Manifest({"worker": spec("worker", 60.0)})) is None


def quiet(idle_s: float, open_: int = 0) -> Activity:
    return Activity(idle_s=idle_s, open=open_)


def test_an_instance_idle_past_its_bound_with_nothing_open_is_parked() -> None:
    awake = [Awake("a.test", 60.0, awake_for_s=1000.0)]
    assert to_park(awake, {"a.test": quiet(60.0)}) == ["a.test"]


def test_an_instance_idle_less_than_its_bound_is_not_parked() -> None:
    awake = [Awake("a.test", 60.0, awake_for_s=1000.0)]
    assert to_park(awake, {"a.test": quiet(59.9)}) == []


def test_an_open_websocket_keeps_an_idle_instance_awake() -> None:
    awake = [Awake("a.test", 60.0, awake_for_s=1000.0)]
    assert to_park(awake, {"a.test": quiet(3600.0, open_=1)}) == []


def test_idleness_counts_only_from_when_it_last_woke() -> None:
    # The router's last request was before the park: a wake by hand starts the count.
    awake = [Awake("a.test", 60.0, awake_for_s=5.0)]
    assert to_park(awake, {"a.test": quiet(3600.0)}) == []


def test_a_host_the_router_does_not_report_is_not_known_idle() -> None:
    assert to_park([Awake("a.test", 60.0, awake_for_s=1000.0)], {}) == []


def test_a_fenced_instance_is_left_to_its_fence_holder() -> None:
    awake = [Awake("a.test", 60.0, awake_for_s=1000.0, fenced=True)]
    assert to_park(awake, {"a.test": quiet(3600.0)}) == []


def test_an_instance_that_declares_no_idle_is_never_parked() -> None:
    awake = [Awake("a.test", None, awake_for_s=1e9), Awake("b.test", 1.0, awake_for_s=1e9)]
    assert to_park(awake, {"a.test": quiet(1e9), "b.test": quiet(1e9)}) == ["b.test"]


def _serve_once(path: Path, reply: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn, server:
            conn.recv(1024)
            conn.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_the_activity_client_reads_the_routers_counts(tmp_path: Path) -> None:
    sock = tmp_path / "c.sock"
    thread = _serve_once(sock, b'{"ok":true,"activity":{"a.test":{"idle_s":1.5,"open":2}}}\n')
    assert asyncio.run(fetch_activity(sock)) == {"a.test": Activity(1.5, 2)}
    thread.join(5)


def test_an_older_router_that_refuses_the_op_means_nothing_is_known(tmp_path: Path) -> None:
    sock = tmp_path / "c.sock"
    thread = _serve_once(sock, b'{"ok":false,"error":"unknown op"}\n')
    with pytest.raises(ActivityUnknown, match="unknown op"):
        asyncio.run(fetch_activity(sock))
    thread.join(5)


def test_no_router_on_the_socket_means_nothing_is_known(tmp_path: Path) -> None:
    with pytest.raises(ActivityUnknown):
        asyncio.run(fetch_activity(tmp_path / "absent.sock"))


# -- the frozen tier: freeze first, park after `park_after`, and the frozen budget ------


def test_an_idle_instance_is_frozen_first_where_it_may_be() -> None:
    awake = [Awake("a.test", 60.0, awake_for_s=1000.0, park_after_s=900.0),
             Awake("b.test", 60.0, awake_for_s=1000.0, park_after_s=0.0)]
    acts = to_act(awake, {"a.test": quiet(60.0), "b.test": quiet(60.0)})
    assert acts == [("a.test", Verb.FREEZE), ("b.test", Verb.PARK)]


def test_a_frozen_instance_parks_once_frozen_for_its_park_after() -> None:
    frozen = [Awake("a.test", 60.0, 1000.0, park_after_s=900.0, frozen=True,
                    frozen_for_s=899.0),
              Awake("b.test", 60.0, 1000.0, park_after_s=900.0, frozen=True,
                    frozen_for_s=900.0)]
    # The router need not report a frozen instance: its clock is the sweep's own.
    assert to_act(frozen, {}) == [("b.test", Verb.PARK)]


def test_over_the_budget_the_frozen_longest_park_until_the_rest_fit() -> None:
    mb = 1 << 20
    frozen = [Awake(h, 60.0, 1000.0, park_after_s=900.0, frozen=True, frozen_for_s=age,
                    memory_bytes=20 * mb)
              for h, age in (("new.test", 10.0), ("old.test", 300.0), ("mid.test", 100.0))]
    assert to_act(frozen, {}, frozen_budget=45 * mb) == [("old.test", Verb.PARK)]
    assert to_act(frozen, {}, frozen_budget=25 * mb) == [("old.test", Verb.PARK),
                                                          ("mid.test", Verb.PARK)]
    assert to_act(frozen, {}, frozen_budget=60 * mb) == []
    # One parking anyway (past its park_after) counts as gone from the budget.
    frozen[1] = Awake("old.test", 60.0, 1000.0, park_after_s=200.0, frozen=True,
                      frozen_for_s=300.0, memory_bytes=20 * mb)
    assert to_act(frozen, {}, frozen_budget=45 * mb) == [("old.test", Verb.PARK)]


def test_a_fenced_frozen_instance_is_left_to_its_fence_holder() -> None:
    frozen = [Awake("a.test", 60.0, 1000.0, fenced=True, park_after_s=1.0, frozen=True,
                    frozen_for_s=100.0, memory_bytes=1 << 30)]
    assert to_act(frozen, {}, frozen_budget=1) == []
