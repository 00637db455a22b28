"""Scheduled jobs' scheduler (keelway/deploy/jobs.py), daemon-less: when runs fall due
(on time, missed, spread), which instances run them, what a journaled run means after a
crash (never twice), and the overlap rules and the box's gate. A run itself is stood in
for here (`_Recorded.run_one`); tests/e2e/test_jobs.py runs real ones."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from keelway.builds.manifest import JobSpec, Overlap, load_manifest
from keelway.deploy.jobs import (
    ON_TIME_S,
    Due,
    Jobs,
    due_between,
    jitter_s,
    parse_key,
    run_key,
)
from keelway.journal import OpKind
from keelway.store.lifecycle import OpState
from keelway.testing.clock import FakeClock
from tests.deploy.conftest import Records

MIDNIGHT = datetime(2026, 12, 4, tzinfo=UTC)


def _spec(tmp_path: Path, toml: str, name: str = "nightly") -> JobSpec:
    (tmp_path / "Procfile").write_text("web: python -m app\n")
    (tmp_path / "keelway.toml").write_text(toml)
    return load_manifest(tmp_path).jobs[name]


def _job(tmp_path: Path, schedule: str = "0 0 * * *", **more: str) -> JobSpec:
    lines = [f'schedule = "{schedule}"', 'command = "true"',
             *(f"{k} = {v}" for k, v in more.items())]
    return _spec(tmp_path, "[jobs.nightly]\n" + "\n".join(lines) + "\n")


# -- when runs fall due ------------------------------------------------------------------


def test_a_run_on_time_is_due_once_and_moves_the_cursor(tmp_path: Path) -> None:
    spec = _job(tmp_path)
    decision, cursor = due_between("blog", "a.test", spec, MIDNIGHT - timedelta(hours=1),
                                   MIDNIGHT + timedelta(seconds=5))
    assert [(d.scheduled, d.catch_up) for d in decision.runs] == [(MIDNIGHT, False)]
    assert cursor == MIDNIGHT and decision.skipped == 0
    again, same = due_between("blog", "a.test", spec, cursor, MIDNIGHT + timedelta(seconds=6))
    assert again.runs == () and same == cursor


@pytest.mark.parametrize(("missed", "expected", "skipped"), [
    ('"skip"', [], 3), ('"once"', [MIDNIGHT + timedelta(hours=2)], 2),
    ('"all"', [MIDNIGHT, MIDNIGHT + timedelta(hours=1), MIDNIGHT + timedelta(hours=2)], 0)])
def test_runs_missed_while_down_are_caught_up_as_missed_says(
        tmp_path: Path, missed: str, expected: list[datetime], skipped: int) -> None:
    spec = _job(tmp_path, "0 * * * *", missed=missed)
    now = MIDNIGHT + timedelta(hours=2, minutes=30)
    decision, cursor = due_between("blog", "a.test", spec, MIDNIGHT - timedelta(minutes=1), now)
    assert [d.scheduled for d in decision.runs] == expected
    assert all(d.catch_up and d.start_at == now.timestamp() for d in decision.runs)
    assert decision.skipped == skipped and cursor == MIDNIGHT + timedelta(hours=2)


def test_missed_runs_older_than_the_window_are_not_run(tmp_path: Path) -> None:
    spec = _job(tmp_path, "0 * * * *", missed='"all"', missed_window='"90m"')
    now = MIDNIGHT + timedelta(hours=3, minutes=10)
    decision, _ = due_between("blog", "a.test", spec, MIDNIGHT - timedelta(minutes=1), now)
    assert [d.scheduled for d in decision.runs] == [MIDNIGHT + timedelta(hours=2),
                                                    MIDNIGHT + timedelta(hours=3)]
    assert decision.skipped == 2


def test_a_run_late_by_less_than_the_on_time_bound_is_on_time(tmp_path: Path) -> None:
    spec = _job(tmp_path, missed='"skip"')
    late = MIDNIGHT + timedelta(seconds=ON_TIME_S - 1)
    decision, _ = due_between("blog", "a.test", spec, MIDNIGHT - timedelta(minutes=1), late)
    assert [(d.scheduled, d.catch_up) for d in decision.runs] == [(MIDNIGHT, False)]


def test_a_spread_puts_each_run_at_the_same_moment_within_it_every_time(
        tmp_path: Path) -> None:
    spec = _job(tmp_path, spread='"10m"')
    jitters = [jitter_s(spec, f"t{i}.test", MIDNIGHT) for i in range(1000)]
    assert all(0 <= j < 600 for j in jitters)
    assert jitters == [jitter_s(spec, f"t{i}.test", MIDNIGHT) for i in range(1000)]
    # Spread, not bunched: every minute of the ten has some of them.
    assert {int(j // 60) for j in jitters} == set(range(10))
    decision, _ = due_between("blog", "t7.test", spec, MIDNIGHT - timedelta(minutes=1),
                              MIDNIGHT)
    assert decision.runs[0].start_at == MIDNIGHT.timestamp() + jitters[7]


def test_a_runs_key_names_its_job_and_time_and_reads_back() -> None:
    key = run_key("nightly", MIDNIGHT)
    assert key == "job:nightly@2026-12-04T00:00Z"
    assert parse_key(key) == ("nightly", MIDNIGHT)
    assert parse_key("job:nightly@by-hand-12.5") is None


@pytest.mark.parametrize(("toml", "said"), [
    ('[jobs.x]\nschedule = "61 * * * *"\ncommand = "true"\n', "schedule"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = " "\n', "command: is empty"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\noverlap = "twice"\n', "overlap"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\nmissed = "some"\n', "missed"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\ninstances = "two"\n', "instances"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\nspread = "1m"\n', "spread"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\ntimeout = 0\n', "timeout"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\ntimezone = "Mars/Base"\n', "timezone"),
    ('[jobs.X]\nschedule = "* * * * *"\ncommand = "t"\n', "not a valid job name"),
    ('[jobs.x]\nschedule = "* * * * *"\ncommand = "t"\nevery = "1m"\n', "every"),
])
def test_a_bad_job_table_is_refused_naming_what_to_fix(tmp_path: Path, toml: str,
                                                        said: str) -> None:
    from keelway.builds.errors import ManifestError

    with pytest.raises(ManifestError, match=said):
        _spec(tmp_path, toml, "x")


# -- the scheduler over records ------------------------------------------------------------


@dataclass(eq=False)
class _Recorded(Jobs):
    """The scheduler with each run stood in for: recorded, and held until released."""

    ran: list[Due] = field(default_factory=list)
    hold: asyncio.Event | None = None
    at_once: int = 0
    most_at_once: int = 0

    async def run_one(self, due: Due) -> None:
        self.ran.append(due)
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        try:
            if self.hold is not None:
                await self.hold.wait()
        finally:
            self.at_once -= 1


TOML = """
[jobs.nightly]
schedule = "{schedule}"
command = "true"
{more}
"""


def _scheduler(records: Records, hosts: list[str], more: str = "", *,
               schedule: str = "0 0 * * *", jobs_at_once: int = 8,
               boot: bool = True) -> _Recorded:
    """The scheduler of `hosts`' job; `boot`: its first pass made at once (an hour
    before midnight), else left to the test (a boot after what it journals)."""
    for host in hosts:
        records.instance(host, app="blog")
        records.running(host)
    (records.builds / "blog" / "keelway.toml").write_text(
        TOML.format(schedule=schedule, more=more))
    clock = records.store.clock
    assert isinstance(clock, FakeClock)
    clock.advance(MIDNIGHT.timestamp() - 3600 - clock.now())  # an hour before midnight
    jobs = _Recorded(records.store, None, None, None, None, clock,  # type: ignore[arg-type]
                     jobs_at_once)
    if boot:
        jobs.tick()
    return jobs


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _at(jobs: _Recorded, when: datetime) -> None:
    clock = jobs.clock
    assert isinstance(clock, FakeClock)
    clock.advance(when.timestamp() - clock.now())


def test_each_instance_runs_its_job_once_at_its_time(records: Records) -> None:
    async def go() -> None:
        jobs = _scheduler(records, ["a.test", "b.test"])
        assert jobs.tick() == []
        _at(jobs, MIDNIGHT + timedelta(seconds=1))
        started = jobs.tick()
        assert sorted(d.host for d in started) == ["a.test", "b.test"]
        assert all(d.scheduled == MIDNIGHT for d in started)
        await _settle()
        _at(jobs, MIDNIGHT + timedelta(seconds=30))
        assert jobs.tick() == []  # the same time never falls due twice
        await _settle()
        assert len(jobs.ran) == 2

    asyncio.run(go())


def test_an_app_wide_job_runs_on_one_instance_not_fenced(records: Records) -> None:
    async def go() -> None:
        jobs = _scheduler(records, ["a.test", "b.test", "c.test"], 'instances = "one"')
        records.store.instances.fence("a.test", "migrating")
        jobs.refresh()  # the fence is read at the next refresh
        _at(jobs, MIDNIGHT + timedelta(seconds=1))
        assert [d.host for d in jobs.tick()] == ["b.test"]

    asyncio.run(go())


def test_a_run_journaled_before_a_crash_is_not_started_again(records: Records) -> None:
    """Boot reads the cursors from the journal: a scheduled time with an operation (it
    began, whatever became of it) is dealt with."""
    async def go() -> None:
        jobs = _scheduler(records, ["a.test", "b.test"], boot=False)
        _at(jobs, MIDNIGHT + timedelta(seconds=20))
        began = records.store.ops.begin_operation("blog", "a.test", OpKind.JOB, owner="x",
                                                  key=run_key("nightly", MIDNIGHT))
        records.store.ops.finish_operation(began, OpState.FAILED, error="interrupted")
        assert [d.host for d in jobs.tick()] == ["b.test"]

    asyncio.run(go())


def test_after_downtime_a_missed_run_is_caught_up_once(records: Records) -> None:
    async def go() -> None:
        jobs = _scheduler(records, ["a.test"], schedule="0 * * * *", boot=False)
        # The job ran at 22:00 the day before; keelway was down from then until 02:30.
        ran = records.store.ops.begin_operation(
            "blog", "a.test", OpKind.JOB, owner="x",
            key=run_key("nightly", MIDNIGHT - timedelta(hours=2)))
        records.store.ops.finish_operation(ran, OpState.SUCCEEDED)
        _at(jobs, MIDNIGHT + timedelta(hours=2, minutes=30))
        started = jobs.tick()
        assert [(d.scheduled, d.catch_up) for d in started] == [
            (MIDNIGHT + timedelta(hours=2), True)]
        events = records.store.ops.list_events("blog")
        assert any("3 runs missed" in e.message for e in events), events

    asyncio.run(go())


def test_a_job_new_to_the_scheduler_at_boot_has_missed_nothing(records: Records) -> None:
    async def go() -> None:
        jobs = _scheduler(records, ["a.test"], boot=False)
        _at(jobs, MIDNIGHT + timedelta(days=3, hours=5))
        assert jobs.tick() == []

    asyncio.run(go())


def test_a_job_deployed_just_before_its_time_runs_at_it(records: Records) -> None:
    """A deploy between two refreshes: the job counts from the refresh before it."""
    async def go() -> None:
        jobs = _scheduler(records, ["a.test"])
        (records.builds / "blog" / "keelway.toml").write_text("")
        _at(jobs, MIDNIGHT - timedelta(seconds=5))
        assert jobs.tick() == []  # no job yet
        (records.builds / "blog" / "keelway.toml").write_text(
            TOML.format(schedule="0 0 * * *", more=""))
        jobs._manifests.clear()  # a new build, as a deploy stages one
        _at(jobs, MIDNIGHT + timedelta(seconds=6))
        assert [d.scheduled for d in jobs.tick()] == [MIDNIGHT]

    asyncio.run(go())


def test_runs_of_a_spread_job_start_at_their_own_moments(records: Records) -> None:
    async def go() -> None:
        hosts = [f"t{i}.test" for i in range(40)]
        jobs = _scheduler(records, hosts, 'spread = "10m"')
        starts: dict[str, float] = {}
        for second in range(0, 601, 5):
            _at(jobs, MIDNIGHT + timedelta(seconds=second))
            for due in jobs.tick():
                starts[due.host] = second
        assert sorted(starts) == sorted(hosts)
        assert len({int(s // 60) for s in starts.values()}) >= 8  # not all at once
        spec = next(iter(jobs._tracks.values())).spec
        for host, second in starts.items():
            assert second - 5 < jitter_s(spec, host, MIDNIGHT) <= second

    asyncio.run(go())


def _overlapping(records: Records, overlap: str) -> _Recorded:
    jobs = _scheduler(records, ["a.test"], f'overlap = "{overlap}"', schedule="* * * * *")
    _at(jobs, MIDNIGHT - timedelta(seconds=30))
    jobs.tick()  # 23:58 and 23:59 fall due (and end at once) before the test's minutes
    return jobs


@pytest.mark.parametrize("overlap", ["skip", "queue"])
def test_a_run_due_while_the_last_still_runs_is_skipped_or_queued(
        records: Records, overlap: str) -> None:
    async def go() -> None:
        jobs = _overlapping(records, overlap)
        await _settle()
        jobs.ran.clear()
        jobs.hold = asyncio.Event()
        for minute in range(3):
            _at(jobs, MIDNIGHT + timedelta(minutes=minute, seconds=1))
            jobs.tick()
            await _settle()
        assert len(jobs.ran) == 1  # the first holds
        assert jobs.hold is not None
        jobs.hold.set()
        await _settle()
        ran = [d.scheduled for d in jobs.ran]
        if Overlap(overlap) is Overlap.SKIP:
            assert ran == [MIDNIGHT]
            said = [e.message for e in records.store.ops.list_events("blog")]
            assert sum("skipped" in m and " 00:0" in m for m in said) == 2, said
        else:
            assert ran == [MIDNIGHT + timedelta(minutes=m) for m in range(3)]

    asyncio.run(go())


def test_the_box_runs_no_more_jobs_at_once_than_its_gate(records: Records) -> None:
    async def go() -> None:
        jobs = _scheduler(records, [f"t{i}.test" for i in range(7)], jobs_at_once=3)
        jobs.hold = asyncio.Event()
        _at(jobs, MIDNIGHT + timedelta(seconds=1))
        assert len(jobs.tick()) == 7
        await _settle()
        assert jobs.most_at_once == 3 and len(jobs.ran) == 3
        jobs.hold.set()
        await _settle()
        assert len(jobs.ran) == 7 and jobs.most_at_once == 3

    asyncio.run(go())


def test_missed_all_catch_ups_queue_behind_each_other(records: Records) -> None:
    async def go() -> None:
        jobs = _scheduler(records, ["a.test"], 'missed = "all"', schedule="0 * * * *",
                          boot=False)
        ran = records.store.ops.begin_operation(
            "blog", "a.test", OpKind.JOB, owner="x",
            key=run_key("nightly", MIDNIGHT - timedelta(hours=1)))
        records.store.ops.finish_operation(ran, OpState.SUCCEEDED)
        jobs.hold = asyncio.Event()
        _at(jobs, MIDNIGHT + timedelta(hours=2, minutes=30))
        assert len(jobs.tick()) == 3
        await _settle()
        assert len(jobs.ran) == 1
        jobs.hold.set()
        await _settle()
        assert [d.scheduled for d in jobs.ran] == [MIDNIGHT + timedelta(hours=h)
                                                  for h in range(3)]

    asyncio.run(go())


def test_run_now_dispatches_by_hand_and_refuses_an_unknown_job(records: Records) -> None:
    from keelway.deploy.errors import NotFoundError

    async def go() -> None:
        jobs = _scheduler(records, ["a.test", "b.test"])
        assert jobs.run_now("blog", "nightly", "b.test") == ["b.test"]
        await _settle()
        assert [(d.host, d.scheduled) for d in jobs.ran] == [("b.test", None)]
        with pytest.raises(NotFoundError, match="no job 'weekly'"):
            jobs.run_now("blog", "weekly", None)
        listing = jobs.listing("blog")
        assert [j["name"] for j in listing["jobs"]] == ["nightly"]  # type: ignore[index]

    asyncio.run(go())

