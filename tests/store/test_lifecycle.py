"""The lifecycles' transition tables (keelway/store/lifecycle.py), read alone."""

from __future__ import annotations

import pytest

from keelway.store.lifecycle import IllegalTransition, InstanceState, RouteState, check


def test_a_parked_route_is_served_gated_or_held_again_never_drained() -> None:
    for state in (RouteState.SERVING, RouteState.GATED, RouteState.HOLDING):
        check(RouteState.PARKED, state)
    with pytest.raises(IllegalTransition):
        check(RouteState.PARKED, RouteState.DRAINING)


def test_a_parked_instance_wakes_stops_or_goes_down_and_only_a_running_one_parks() -> None:
    for state in (InstanceState.RUNNING, InstanceState.STOPPED, InstanceState.DOWN):
        check(InstanceState.PARKED, state)
    check(InstanceState.RUNNING, InstanceState.PARKED)
    for state in (InstanceState.STOPPED, InstanceState.DOWN):
        with pytest.raises(IllegalTransition):
            check(state, InstanceState.PARKED)
