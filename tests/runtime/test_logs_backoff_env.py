from __future__ import annotations

import stat
from pathlib import Path

from keelway.home import Home
from keelway.runtime.backoff import (
    QUICK_DELAYS_S,
    SLOW_DELAYS_S,
    STABLE_RESET_S,
    Backoff,
    next_retry,
)
from keelway.runtime.environment import (
    INSTANCE_KEY,
    ensure_instance_key,
    process_env,
    read_env_file,
)
from keelway.runtime.logs import read_from, rotate_if_large, tail_lines


def test_backoff_tries_three_times_quickly_then_slows_to_fifteen_minutes() -> None:
    backoff = Backoff()
    backoff.started(0)
    delays = [backoff.delay_after_crash(1.0) for _ in range(10)]
    assert delays[:3] == list(QUICK_DELAYS_S)
    assert delays[3:8] == list(SLOW_DELAYS_S)
    assert delays[8:] == [900.0, 900.0]


def test_backoff_resets_after_five_stable_minutes() -> None:
    backoff = Backoff()
    for _ in range(5):
        backoff.delay_after_crash(0)
    backoff.started(1000)
    assert backoff.delay_after_crash(1000 + STABLE_RESET_S) == QUICK_DELAYS_S[0]


def test_rotation_keeps_the_file_in_place_and_its_history_beside_it(tmp_path: Path) -> None:
    log = tmp_path / "web.1.log"
    with open(log, "ab") as handle:  # as a process holding it with O_APPEND
        handle.write(b"x" * 100)
        handle.flush()
        assert rotate_if_large(log, max_bytes=50)
        handle.write(b"after\n")
        handle.flush()
    assert log.read_bytes() == b"after\n"
    assert (tmp_path / "web.1.log.1").read_bytes() == b"x" * 100
    assert not rotate_if_large(log, max_bytes=50)


def test_tail_and_follow_read_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "web.1.log"
    log.write_text("a\nb\nc\npart")
    lines, _offset = tail_lines(log, 2)
    assert lines == ["c", "part"]
    more, offset2 = read_from(log, 4)
    assert more == ["c"] and offset2 == 6  # "part" has no newline yet
    log.write_text("")  # truncated by rotation: reading starts again at 0
    assert read_from(log, offset2) == ([], 0)


def test_the_instance_key_is_minted_once_into_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "env" / "a.test.env"
    assert ensure_instance_key(path)
    key = read_env_file(path)[INSTANCE_KEY]
    assert len(key) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not ensure_instance_key(path)
    assert read_env_file(path)[INSTANCE_KEY] == key


def test_a_generation_gets_the_contract_environment_and_nothing_of_ours(
    tmp_path: Path, monkeypatch: object
) -> None:
    home = Home(tmp_path)
    home.ensure()
    ensure_instance_key(home.env_file("a.test"))
    env = process_env(home=home, app="blog", instance="a.test", service="web", release=7,
                      generation=42, port=4321, config={"GREETING": "hi"},
                      build_path=tmp_path / "build")
    assert env["KEELWAY_RELEASE"] == "v7"
    assert env["KEELWAY_GENERATION"] == "42"
    assert env["PORT"] == "4321"
    assert env["KEELWAY_DB"].endswith("data/a.test/db.sqlite3")
    assert env["DATABASE_URL"] == f"sqlite:///{env['KEELWAY_DB']}"
    assert env["GREETING"] == "hi"
    assert INSTANCE_KEY in env
    assert "KEELWAY_HOME" not in env


def test_a_persisted_count_resumes_where_the_last_control_plane_left_it() -> None:
    # Four crashes counted before a restart of the control plane: the fifth waits 2 min.
    assert next_retry(4, started_at=100.0, now=110.0, same_generation=False) == (5, 120.0)


def test_a_failed_restart_counts_again_however_old_its_generation_is() -> None:
    # The generation crashed after an hour (the count reset), and every restart meant to
    # replace it failed before it was ready: the count still climbs.
    failures, delay = next_retry(0, started_at=0.0, now=3600.0, same_generation=False)
    assert (failures, delay) == (1, QUICK_DELAYS_S[0])
    for expected in (*QUICK_DELAYS_S[1:], *SLOW_DELAYS_S[:2]):
        failures, delay = next_retry(failures, started_at=0.0, now=3700.0,
                                     same_generation=True)
        assert delay == expected


def test_a_successor_that_stayed_up_five_minutes_starts_the_count_again() -> None:
    assert next_retry(7, started_at=0.0, now=STABLE_RESET_S, same_generation=False) == (
        1, QUICK_DELAYS_S[0])
