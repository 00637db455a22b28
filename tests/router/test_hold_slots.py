"""Hold slots: one bound on held requests per host across a router's workers."""

from __future__ import annotations

from keelway.router.hold_slots import HoldSlots


def test_a_host_gets_no_more_slots_than_its_bound_whichever_worker_asks() -> None:
    slots = HoldSlots(max_held=100, max_held_per_host=3)
    assert [slots.take(1, "a.test"), slots.take(2, "a.test"), slots.take(2, "a.test")] == [
        True, True, True]
    assert not slots.take(1, "a.test") and not slots.take(3, "a.test")
    assert slots.take(1, "b.test")  # another host has its own bound
    assert slots.held() == {"a.test": 3, "b.test": 1}


def test_a_slot_given_back_can_be_taken_again() -> None:
    slots = HoldSlots(max_held=100, max_held_per_host=1)
    assert slots.take(1, "a.test")
    slots.give_back(1, "a.test")
    assert slots.take(2, "a.test")
    slots.give_back(1, "a.test")  # not its slot: worker 2 still holds it
    assert not slots.take(1, "a.test")


def test_the_router_wide_bound_holds_across_hosts() -> None:
    slots = HoldSlots(max_held=2, max_held_per_host=5)
    assert slots.take(1, "a.test") and slots.take(2, "b.test")
    assert not slots.take(1, "c.test")


def test_a_gone_worker_frees_every_slot_it_held() -> None:
    slots = HoldSlots(max_held=10, max_held_per_host=2)
    assert slots.take(1, "a.test") and slots.take(1, "a.test") and slots.take(2, "b.test")
    slots.forget(1)
    assert slots.held() == {"b.test": 1}
    assert slots.take(3, "a.test") and slots.take(3, "a.test")
    slots.give_back(1, "a.test")  # a late word from the gone worker changes nothing
    assert slots.held() == {"a.test": 2, "b.test": 1}
