"""The fallback table of SPEC §4 Deployer and reference/002, one test per cell.

Each cell is written out here on its own, with the rule it comes from, rather than read
back from `FALLBACK`: a changed cell must fail its own test.
"""

from __future__ import annotations

import itertools

import pytest

from keelway.builds.manifest import Mode
from keelway.deploy.plan import FALLBACK, Fallback, fallback, fallbacks_of, needs_evidence
from keelway.journal import Cause

RESPAWN, LAST_GOOD, DOWN = Fallback.RESPAWN_REPLACED, Fallback.LAST_GOOD, Fallback.DOWN


def test_a_failed_restart_in_overlap_mode_respawns_what_it_replaced() -> None:
    assert fallback(Cause.RESTART, Mode.OVERLAP, False) is RESPAWN


def test_a_failed_restart_in_overlap_mode_respawns_what_it_replaced_even_once_executed() -> None:
    assert fallback(Cause.RESTART, Mode.OVERLAP, True) is RESPAWN


def test_a_failed_restart_in_hold_mode_respawns_what_it_replaced() -> None:
    assert fallback(Cause.RESTART, Mode.HOLD, False) is RESPAWN


def test_a_restart_in_hold_mode_that_executed_still_respawns_the_same_build() -> None:
    # The same build ran before: there is no new data migration to protect.
    assert fallback(Cause.RESTART, Mode.HOLD, True) is RESPAWN


def test_a_failed_config_change_in_overlap_mode_respawns_what_it_replaced() -> None:
    assert fallback(Cause.CONFIG, Mode.OVERLAP, False) is RESPAWN


def test_a_failed_config_change_in_overlap_mode_that_executed_respawns_what_it_replaced() -> None:
    assert fallback(Cause.CONFIG, Mode.OVERLAP, True) is RESPAWN


def test_a_failed_config_change_in_hold_mode_respawns_what_it_replaced() -> None:
    assert fallback(Cause.CONFIG, Mode.HOLD, False) is RESPAWN


def test_a_config_change_in_hold_mode_that_executed_respawns_what_it_replaced() -> None:
    # A config change keeps the build: the one it replaced runs on its own data.
    assert fallback(Cause.CONFIG, Mode.HOLD, True) is RESPAWN


def test_a_failed_release_in_overlap_mode_falls_back_to_the_last_good_build() -> None:
    assert fallback(Cause.RELEASE, Mode.OVERLAP, False) is LAST_GOOD


def test_a_release_in_overlap_mode_that_executed_still_falls_back_to_the_last_good_build() -> None:
    assert fallback(Cause.RELEASE, Mode.OVERLAP, True) is LAST_GOOD


def test_a_hold_release_refused_before_it_executed_falls_back_to_the_last_good_build() -> None:
    # Nothing of the new build ran: the old one's data is untouched.
    assert fallback(Cause.RELEASE, Mode.HOLD, False) is LAST_GOOD


def test_a_hold_release_that_executed_is_never_fallen_back_and_the_instance_stays_down() -> None:
    assert fallback(Cause.RELEASE, Mode.HOLD, True) is DOWN


def test_the_table_has_exactly_one_cell_per_cause_mode_and_execution_evidence() -> None:
    cells = set(itertools.product(Cause, Mode, (False, True)))
    assert set(FALLBACK) == cells and len(FALLBACK) == len(cells)


@pytest.mark.parametrize(("cause", "mode", "wanted"), [
    (Cause.RELEASE, Mode.HOLD, True),
    (Cause.RELEASE, Mode.OVERLAP, False),
    (Cause.RESTART, Mode.HOLD, False),
    (Cause.CONFIG, Mode.HOLD, False),
])
def test_the_execution_evidence_is_journaled_only_where_the_table_tells_it_apart(
        cause: Cause, mode: Mode, wanted: bool) -> None:
    assert needs_evidence(cause, mode) is wanted


def test_only_a_release_can_fall_back_to_the_last_good_build_or_go_down() -> None:
    assert fallbacks_of(Cause.RELEASE) == {LAST_GOOD, DOWN}
    assert fallbacks_of(Cause.RESTART) == fallbacks_of(Cause.CONFIG) == {RESPAWN}
