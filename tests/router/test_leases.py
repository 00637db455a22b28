"""Leases: an instance's bound on requests in flight, lent to workers, never over it;
an ask the free slots cannot fill waits for what the other workers do not use."""

from __future__ import annotations

from keelway.router.leases import Grant, Leases, Reclaim


def test_what_is_lent_of_an_instance_never_passes_its_bound_whichever_worker_asks() -> None:
    leases = Leases()
    assert leases.ask(1, "a.test", 8, bound=10) == Grant(1, "a.test", 8)
    assert leases.ask(2, "a.test", 8, bound=10) == Reclaim("a.test", (1,))
    assert leases.spare(1, "a.test", 0) == [Grant(2, "a.test", 2)]  # what was left
    assert leases.ask(3, "a.test", 1, bound=10) == Reclaim("a.test", (1, 2))
    assert leases.spare(1, "a.test", 0) == []  # it waits on worker 2 as well
    assert leases.spare(2, "a.test", 0) == [Grant(3, "a.test", 0)]
    assert leases.ask(3, "b.test", 8, bound=10) == Grant(3, "b.test", 8)  # its own bound
    assert leases.lent() == {"a.test": 10, "b.test": 8}


def test_an_ask_that_waits_takes_what_the_other_workers_do_not_use() -> None:
    leases = Leases()
    assert leases.ask(1, "a.test", 4, bound=4) == Grant(1, "a.test", 4)
    assert leases.ask(2, "a.test", 2, bound=4) == Reclaim("a.test", (1,))
    assert leases.spare(1, "a.test", 3) == [Grant(2, "a.test", 2)]
    assert leases.lent() == {"a.test": 3}


def test_an_ask_nobody_else_holds_for_is_answered_at_once_even_short() -> None:
    leases = Leases()
    assert leases.ask(1, "a.test", 4, bound=2) == Grant(1, "a.test", 2)
    assert leases.ask(1, "a.test", 1, bound=2) == Grant(1, "a.test", 0)


def test_a_holder_returns_only_its_own_and_a_lowered_bound_takes_nothing_back() -> None:
    leases = Leases()
    assert leases.ask(1, "a.test", 6, bound=6) == Grant(1, "a.test", 6)
    leases.give_back(1, "a.test", 9)  # more than it has: only its six go back
    leases.give_back(2, "a.test", 2)  # never lent any: nothing changes
    assert leases.lent() == {}
    assert leases.ask(1, "a.test", 6, bound=6) == Grant(1, "a.test", 6)
    assert leases.ask(2, "a.test", 1, bound=2) == Reclaim("a.test", (1,))
    assert leases.spare(1, "a.test", 5) == [Grant(2, "a.test", 1)]


def test_a_gone_worker_frees_everything_and_answers_what_waited_on_it() -> None:
    leases = Leases()
    assert leases.ask(1, "a.test", 3, bound=3) == Grant(1, "a.test", 3)
    assert leases.ask(2, "a.test", 1, bound=3) == Reclaim("a.test", (1,))
    assert leases.forget(1) == [Grant(2, "a.test", 1)]
    assert leases.lent() == {"a.test": 1}
    leases.give_back(1, "a.test", 3)  # a late word from the gone worker changes nothing
    assert leases.lent() == {"a.test": 1}


def test_a_gone_workers_own_waiting_ask_is_dropped() -> None:
    leases = Leases()
    assert leases.ask(1, "a.test", 2, bound=2) == Grant(1, "a.test", 2)
    assert leases.ask(2, "a.test", 1, bound=2) == Reclaim("a.test", (1,))
    assert leases.forget(2) == []
    assert leases.spare(1, "a.test", 2) == []
    assert leases.lent() == {}
