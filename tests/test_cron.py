"""cron.Schedule: every spelling a field takes, every refusal and its message, the day
rule, the DST rule, and properties checked against a minute-by-minute reference.

The reference (`_fires_at`) reads the rules off the module header in another way than
the module does: it walks real minutes in UTC and asks what the wall clock shows, where
the module walks wall times and asks when they happen. The random expressions carry the
values they select, written down by the strategy that spelt them, so the reference never
borrows the parser's reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keelway.cron import MACROS, CronError, Schedule, parse

MINUTE = timedelta(minutes=1)
NEW_YORK = "America/New_York"
PROPERTY = settings(max_examples=40, deadline=None)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0,
        second: int = 0, microsecond: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, microsecond, tzinfo=UTC)


def fires(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    return parse(expr, tz).between(start, end, limit=1000)


# Syntax.


@pytest.mark.parametrize(("expr", "field", "selected"), [
    ("* * * * *", "minutes", set(range(60))),
    ("7 * * * *", "minutes", {7}),
    ("07 * * * *", "minutes", {7}),
    ("1-5 * * * *", "minutes", {1, 2, 3, 4, 5}),
    ("1,3,5 * * * *", "minutes", {1, 3, 5}),
    ("*/15 * * * *", "minutes", {0, 15, 30, 45}),
    ("10-50/10 * * * *", "minutes", {10, 20, 30, 40, 50}),
    ("1-3,10,*/20 * * * *", "minutes", {0, 1, 2, 3, 10, 20, 40}),
    ("0 */6 * * *", "hours", {0, 6, 12, 18}),
    ("0 0 1-7 * *", "days", set(range(1, 8))),
    ("0 0 * JAN,jul *", "months", {1, 7}),
    ("0 0 * mar-May *", "months", {3, 4, 5}),
    ("0 0 * */3 *", "months", {1, 4, 7, 10}),
    ("0 0 * * MON-fri", "weekdays", {1, 2, 3, 4, 5}),
    ("0 0 * * 7", "weekdays", {0}),
    ("0 0 * * 0,7", "weekdays", {0}),
    ("0 0 * * 0-7", "weekdays", set(range(7))),
    ("0 0 * * 5-7", "weekdays", {5, 6, 0}),
    ("0 0 * * fri-sun", "weekdays", {5, 6, 0}),
    ("0 0 * * */2", "weekdays", {0, 2, 4, 6}),
    ("0 0 * * 1-7/2", "weekdays", {1, 3, 5, 0}),
])
def test_each_spelling_of_a_field_selects_its_values(expr: str, field: str,
                                                      selected: set[int]) -> None:
    assert set(getattr(parse(expr), field)) == selected


@pytest.mark.parametrize(("macro", "expr"), sorted(MACROS.items()))
def test_a_macro_is_the_expression_it_stands_for(macro: str, expr: str) -> None:
    assert parse(macro) == parse(expr)
    assert parse(macro.upper()) == parse(expr)


def test_the_macros_are_the_usual_ones() -> None:
    assert parse("@hourly").expression == "0 * * * *"
    assert parse("@daily").expression == parse("@midnight").expression == "0 0 * * *"
    assert parse("@weekly").expression == "0 0 * * sun"
    assert parse("@monthly").expression == "0 0 1 * *"
    assert parse("@yearly").expression == parse("@annually").expression == "0 0 1 jan *"


def test_fields_are_separated_by_any_whitespace() -> None:
    assert parse("  */5\t*  * *\n*\n") == parse("*/5 * * * *")


@pytest.mark.parametrize(("expr", "normal"), [
    ("*/15 * * * *", "*/15 * * * *"),
    ("0-59 0-23 1-31 1-12 0-7", "* * * * *"),
    ("5-59/10 9-17 1,2,15 JAN-MAR mon-fri", "5-55/10 9-17 1,2,15 jan-mar mon-fri"),
    ("0,1,2,3,30 0,12 * * 6,7", "0-3,30 0,12 * * sun,sat"),
    ("0 0 * * 1,3,5", "0 0 * * mon-fri/2"),
    ("@weekly", "0 0 * * sun"),
])
def test_describe_gives_the_normalized_expression_and_the_timezone(expr: str,
                                                                   normal: str) -> None:
    schedule = parse(expr, "Europe/Berlin")
    assert schedule.expression == normal
    assert schedule.describe() == str(schedule) == f"{normal} (Europe/Berlin)"
    assert parse(normal, "Europe/Berlin") == schedule


# Refusals.


@pytest.mark.parametrize(("expr", "message"), [
    ("", "the schedule is empty; write five fields such as '*/15 * * * *'"),
    (" \t\n", "the schedule is empty; write five fields such as '*/15 * * * *'"),
    ("* * * *", "expected 5 fields (minute hour day-of-month month day-of-week), "
                "got 4 in '* * * *'"),
    ("* * * * * *", "expected 5 fields (minute hour day-of-month month day-of-week), "
                    "got 6 in '* * * * * *'"),
    ("1,,2 * * * *", "minute: empty item in the list '1,,2'"),
    ("1, * * * *", "minute: empty item in the list '1,'"),
    ("*/0 * * * *", "minute: the step 0 in '*/0' is out of range 1-59"),
    ("*/60 * * * *", "minute: the step 60 in '*/60' is out of range 1-59"),
    ("0 0 * * */7", "day-of-week: the step 7 in '*/7' is out of range 1-6"),
    ("*/ * * * *", "minute: no step after '/' in '*/'"),
    ("*/x * * * *", "minute: the step 'x' in '*/x' is not a number"),
    ("5-1 * * * *", "minute: the range '5-1' runs backwards; write the lower value first, "
                    "or a list of two ranges to wrap around"),
    ("0 0 * * fri-mon", "day-of-week: the range 'fri-mon' runs backwards; write the lower "
                        "value first, or a list of two ranges to wrap around"),
    ("61 * * * *", "minute: 61 is out of range 0-59"),
    ("0 24 * * *", "hour: 24 is out of range 0-23"),
    ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
    ("0 0 32 * *", "day-of-month: 32 is out of range 1-31"),
    ("0 0 * 13 *", "month: 13 is out of range 1-12"),
    ("0 0 * 0 *", "month: 0 is out of range 1-12"),
    ("0 0 * * 8", "day-of-week: 8 is out of range 0-7"),
    ("99999999999999 * * * *", "minute: '99999999999999' is out of range 0-59"),
    ("0 0 * foo *", "month: unknown name 'foo'; use jan..dec or 1-12"),
    ("0 0 * january *", "month: unknown name 'january'; use jan..dec or 1-12"),
    ("0 0 * * funday", "day-of-week: unknown name 'funday'; use sun..sat or 0-7"),
    ("mon * * * *", "minute: 'mon' is not a number (0-59)"),
    ("0 0 * jan *x", "day-of-week: '*x' is not a number (0-7)"),
    ("5a * * * *", "minute: '5a' is not a number (0-59)"),
    ("5#2 * * * *", "minute: unexpected character '#' in '5#2'"),
    ("\u0665 * * * *", "minute: unexpected character '\u0665' in '\u0665'"),
    ("5/15 * * * *", "minute: a step needs * or a range before it: write 5-59/15 or 5, "
                     "not '5/15'"),
    ("/5 * * * *", "minute: nothing before '/' in '/5'"),
    ("1- * * * *", "minute: cannot read '1-'; a range is two values such as 0-59"),
    ("-1 * * * *", "minute: cannot read '-1'; a range is two values such as 0-59"),
    ("1-2-3 * * * *", "minute: cannot read '1-2-3'; a range is two values such as 0-59"),
    ("@reboot", "unknown macro '@reboot'; use one of @hourly, @daily, @midnight, @weekly, "
                "@monthly, @yearly, @annually or five fields"),
    ("@daily echo", "@daily stands alone; found '@daily echo'"),
    ("0 0 30 2 *", "day-of-month: 30 never falls in feb, so the schedule would never fire"),
    ("0 0 31 apr,jun,sep,nov *", "day-of-month: 31 never falls in apr,jun,sep,nov, so the "
                                 "schedule would never fire"),
])
def test_a_bad_expression_is_refused_naming_the_field_and_the_part(expr: str,
                                                                   message: str) -> None:
    with pytest.raises(CronError) as refused:
        parse(expr)
    assert str(refused.value) == message


@pytest.mark.parametrize("tz", ["Mars/Base", "", "America", "Europe/", "../etc/passwd",
                                "/etc/localtime", "utc"])
def test_an_unknown_timezone_is_refused(tz: str) -> None:
    with pytest.raises(CronError, match=r"^timezone: unknown name .*; use an IANA name"):
        parse("* * * * *", tz)


def test_a_cron_error_is_a_value_error() -> None:
    assert issubclass(CronError, ValueError)


CRON_ALPHABET = "0123456789*,-/ \tabcdefjlmnoprstuvy@"


@PROPERTY
@given(st.one_of(st.text(max_size=30), st.text(alphabet=CRON_ALPHABET, max_size=30)),
       st.one_of(st.just("UTC"), st.text(max_size=20)))
def test_parse_returns_a_schedule_or_raises_a_cron_error_and_nothing_else(
        text: str, tz: str) -> None:
    try:
        schedule = parse(text, tz)
    except CronError:
        return
    assert parse(schedule.expression, tz) == schedule


# Which days.


def test_with_both_day_fields_restricted_a_day_matching_either_fires() -> None:
    march = fires("0 0 1 * mon", "UTC", utc(2024, 2, 29), utc(2024, 3, 31))
    assert [t.day for t in march] == [1, 4, 11, 18, 25]


def test_a_stepped_day_of_month_counts_as_restricted_however_it_is_spelt() -> None:
    # Vixie cron would read `*/2` as unrestricted and fire only on odd Mondays.
    march = fires("0 0 */2 * mon", "UTC", utc(2024, 2, 29), utc(2024, 3, 12))
    assert [t.day for t in march] == [1, 3, 4, 5, 7, 9, 11]


def test_a_day_field_that_selects_every_day_leaves_the_other_one_alone() -> None:
    assert fires("0 0 1-31 * mon", "UTC", utc(2024, 2, 29), utc(2024, 3, 31)) == fires(
        "0 0 * * mon", "UTC", utc(2024, 2, 29), utc(2024, 3, 31))
    assert [t.day for t in fires("0 0 13 * 0-7", "UTC", utc(2024, 1, 1),
                                 utc(2024, 4, 1))] == [13, 13, 13]


def test_a_day_only_some_months_have_fires_in_those_months() -> None:
    assert [t.month for t in fires("0 0 31 * *", "UTC", utc(2024, 1, 1),
                                   utc(2024, 12, 31))] == [1, 3, 5, 7, 8, 10, 12]


def test_a_leap_day_fires_across_the_skipped_leap_year_of_2100() -> None:
    assert parse("0 0 29 feb *").next_after(utc(2097, 3, 1)) == utc(2104, 2, 29)


def test_a_day_that_no_month_has_is_allowed_when_the_weekday_can_fire() -> None:
    assert parse("0 0 30 feb mon").next_after(utc(2024, 1, 1)) == utc(2024, 2, 5)


# Time and zones.


def test_next_after_is_strictly_after_and_in_utc() -> None:
    schedule = parse("*/15 * * * *")
    assert schedule.next_after(utc(2024, 5, 1, 12, 0)) == utc(2024, 5, 1, 12, 15)
    assert schedule.next_after(utc(2024, 5, 1, 12, 14, 59, 999999)) == utc(2024, 5, 1, 12,
                                                                            15)
    assert schedule.next_after(utc(2024, 12, 31, 23, 59)) == utc(2025, 1, 1)
    assert schedule.next_after(utc(2024, 5, 1)).tzinfo is UTC


def test_fields_are_read_in_the_schedules_timezone_whatever_the_zone_of_t() -> None:
    schedule = parse("0 9 * * mon-fri", "Asia/Tokyo")
    in_tokyo = datetime(2024, 5, 3, 12, 0, tzinfo=ZoneInfo("Asia/Tokyo"))  # a Friday
    assert schedule.next_after(in_tokyo) == utc(2024, 5, 6, 0, 0)  # Monday 09:00 +09:00
    assert schedule.next_after(in_tokyo.astimezone(UTC)) == utc(2024, 5, 6, 0, 0)


def test_a_naive_time_is_refused() -> None:
    schedule = parse("* * * * *")
    with pytest.raises(ValueError, match="must be timezone-aware"):
        schedule.next_after(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="must be timezone-aware"):
        schedule.between(utc(2024, 1, 1), datetime(2024, 1, 2), 5)


def test_a_time_skipped_by_spring_forward_fires_once_at_the_end_of_the_gap() -> None:
    # New York, 2024-03-10: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    assert fires("30 2 * * *", NEW_YORK, utc(2024, 3, 9), utc(2024, 3, 12)) == [
        utc(2024, 3, 9, 7, 30), utc(2024, 3, 10, 7, 0), utc(2024, 3, 11, 6, 30)]
    assert fires("0,30 2 * * *", NEW_YORK, utc(2024, 3, 10), utc(2024, 3, 11)) == [
        utc(2024, 3, 10, 7, 0)]
    assert fires("1 2 * * *", NEW_YORK, utc(2024, 3, 10), utc(2024, 3, 11)) == [
        utc(2024, 3, 10, 7, 0)]  # to the second, not near it
    # 02:00, 02:30 and 03:00 all land on 07:00 UTC, which fires once.
    assert fires("*/30 * * * *", NEW_YORK, utc(2024, 3, 10, 6), utc(2024, 3, 10, 8)) == [
        utc(2024, 3, 10, 6, 30), utc(2024, 3, 10, 7, 0), utc(2024, 3, 10, 7, 30),
        utc(2024, 3, 10, 8, 0)]


def test_a_time_repeated_by_fall_back_fires_once_at_its_first_occurrence() -> None:
    # New York, 2024-11-03: 02:00 EDT (06:00 UTC) falls back to 01:00 EST.
    assert fires("30 1 * * *", NEW_YORK, utc(2024, 11, 2), utc(2024, 11, 5)) == [
        utc(2024, 11, 2, 5, 30), utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)]
    # So a sub-hourly job pauses through the repeated hour.
    assert fires("*/30 * * * *", NEW_YORK, utc(2024, 11, 3, 4), utc(2024, 11, 3, 7)) == [
        utc(2024, 11, 3, 4, 30), utc(2024, 11, 3, 5, 0), utc(2024, 11, 3, 5, 30),
        utc(2024, 11, 3, 7, 0)]
    # From inside the second occurrence, the next fire is after it.
    assert parse("*/30 * * * *", NEW_YORK).next_after(utc(2024, 11, 3, 6, 10)) == utc(
        2024, 11, 3, 7, 0)


def test_half_hour_shifts_follow_the_same_rule() -> None:
    # Lord Howe: 2024-10-06 02:00 +10:30 jumps to 02:30 +11 (15:30 UTC on the 5th), and
    # 2024-04-07 02:00 +11 falls back to 01:30 +10:30 (15:00 UTC on the 6th).
    tz = "Australia/Lord_Howe"
    assert parse("15 2 * * *", tz).next_after(utc(2024, 10, 5)) == utc(2024, 10, 5, 15, 30)
    assert fires("45 1 * * *", tz, utc(2024, 4, 6), utc(2024, 4, 7)) == [
        utc(2024, 4, 6, 14, 45)]


def test_a_day_skipped_by_the_date_line_fires_its_times_at_the_start_of_the_next() -> None:
    # Samoa skipped 2011-12-30: 23:59:59 -10 on the 29th was followed by 00:00 +14 on
    # the 31st (10:00 UTC on the 30th).
    assert fires("0 12 * * *", "Pacific/Apia", utc(2011, 12, 29), utc(2011, 12, 31)) == [
        utc(2011, 12, 29, 22, 0), utc(2011, 12, 30, 10, 0), utc(2011, 12, 30, 22, 0)]


# Between.


def test_between_is_open_at_the_start_closed_at_the_end_and_earliest_first() -> None:
    hourly = parse("@hourly")
    assert hourly.between(utc(2024, 1, 1, 0), utc(2024, 1, 1, 3), 10) == [
        utc(2024, 1, 1, 1), utc(2024, 1, 1, 2), utc(2024, 1, 1, 3)]
    assert hourly.between(utc(2024, 1, 1, 0), utc(2024, 1, 1, 3), 2) == [
        utc(2024, 1, 1, 1), utc(2024, 1, 1, 2)]
    assert hourly.between(utc(2024, 1, 1, 0), utc(2024, 1, 1, 3), 0) == []
    assert hourly.between(utc(2024, 1, 1, 3), utc(2024, 1, 1, 0), 10) == []
    with pytest.raises(ValueError, match="limit"):
        hourly.between(utc(2024, 1, 1), utc(2024, 1, 2), -1)


# Properties.


@dataclass(frozen=True)
class Fields:
    """What an expression selects, as the strategy that spelt it meant it."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]

    def matches(self, wall: datetime) -> bool:
        in_days, on_weekday = wall.day in self.days, wall.isoweekday() % 7 in self.weekdays
        if len(self.days) < 31 and len(self.weekdays) < 7:
            right_day = in_days or on_weekday
        else:
            right_day = in_days and on_weekday
        return (wall.minute in self.minutes and wall.hour in self.hours
                and wall.month in self.months and right_day)

    def ever_fire(self) -> bool:
        # 2024 is a leap year, and every month of every year has every weekday.
        first = datetime(2024, 1, 1, min(self.hours), min(self.minutes))
        return any(self.matches(first + timedelta(days=n)) for n in range(366))


def _fires_at(fields: Fields, zone: ZoneInfo, u: datetime) -> bool:
    """Whether the rules fire at UTC minute `u`: its wall time matches and is not a
    repeat, or the clock just jumped over a wall time that matches."""
    shown = u.astimezone(zone)
    wall = shown.replace(tzinfo=None)
    skipped = (u - MINUTE).astimezone(zone).replace(tzinfo=None) + MINUTE
    while skipped < wall:
        if fields.matches(skipped):
            return True
        skipped += MINUTE
    return shown.fold == 0 and fields.matches(wall)


def _reference(fields: Fields, zone: ZoneInfo, start: datetime,
               end: datetime) -> list[datetime]:
    u = start.replace(second=0, microsecond=0) + MINUTE
    found = []
    while u <= end:
        if _fires_at(fields, zone, u):
            found.append(u)
        u += MINUTE
    return found


Spelt = tuple[str, frozenset[int]]
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
          "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _field(low: int, high: int, written: int, names: tuple[str, ...] = ()
           ) -> st.SearchStrategy[Spelt]:
    """One field's spellings and their values; weekday 7 folds onto 0."""

    def fold(values: range) -> frozenset[int]:
        return frozenset(v % 7 if names == WEEKDAYS else v for v in values)

    @st.composite
    def value(draw: st.DrawFn, least: int = low) -> tuple[str, int]:
        v = draw(st.integers(least, written))
        if names and v - low < len(names) and draw(st.booleans()):
            name = names[v - low]
            return draw(st.sampled_from([name, name.upper(), name.title()])), v
        return str(v), v

    @st.composite
    def item(draw: st.DrawFn) -> Spelt:
        kind = draw(st.sampled_from(["star", "star-step", "value", "range", "range-step"]))
        step = draw(st.integers(1, high - low))
        if kind == "star":
            return "*", fold(range(low, high + 1))
        if kind == "star-step":
            return f"*/{step}", fold(range(low, high + 1, step))
        a_text, a = draw(value())
        if kind == "value":
            return a_text, fold(range(a, a + 1))
        b_text, b = draw(value(least=a))
        if kind == "range":
            return f"{a_text}-{b_text}", fold(range(a, b + 1))
        return f"{a_text}-{b_text}/{step}", fold(range(a, b + 1, step))

    return st.lists(item(), min_size=1, max_size=3).map(
        lambda items: (",".join(text for text, _ in items),
                       frozenset().union(*(values for _, values in items))))


def _or_star(field: st.SearchStrategy[Spelt], everything: range) -> st.SearchStrategy[Spelt]:
    return st.one_of(st.just(("*", frozenset(everything))), field)


MINUTE_FIELD = _field(0, 59, 59)
HOUR_FIELD = _field(0, 23, 23)
DAY_FIELD = _field(1, 31, 31)
MONTH_FIELD = _field(1, 12, 12, MONTHS)
WEEKDAY_FIELD = _field(0, 6, 7, WEEKDAYS)


@st.composite
def expressions(draw: st.DrawFn, often_every_day: bool = False) -> tuple[str, Fields]:
    def maybe_star(field: st.SearchStrategy[Spelt], everything: range
                   ) -> st.SearchStrategy[Spelt]:
        return _or_star(field, everything) if often_every_day else field

    spelt = [draw(MINUTE_FIELD), draw(HOUR_FIELD), draw(maybe_star(DAY_FIELD, range(1, 32))),
             draw(maybe_star(MONTH_FIELD, range(1, 13))),
             draw(maybe_star(WEEKDAY_FIELD, range(7)))]
    return " ".join(text for text, _ in spelt), Fields(*(values for _, values in spelt))


# Each zone with instants at which its clock jumps (UTC): the windows drawn cluster
# there, where the rules differ from reading the clock.
TRANSITIONS = {
    "America/New_York": [utc(2024, 3, 10, 7), utc(2024, 11, 3, 6)],
    "Europe/Berlin": [utc(2024, 3, 31, 1), utc(2024, 10, 27, 1)],
    "Australia/Lord_Howe": [utc(2024, 4, 6, 15), utc(2024, 10, 5, 15, 30)],
    "America/St_Johns": [utc(2024, 3, 10, 5, 30), utc(2024, 11, 3, 4, 30)],
    "Asia/Kathmandu": [utc(1985, 12, 31, 18, 30)],
    "Pacific/Apia": [utc(2011, 12, 30, 10)],
}


@st.composite
def zones_and_times(draw: st.DrawFn) -> tuple[str, datetime]:
    tz = draw(st.sampled_from(["UTC", *sorted(TRANSITIONS)]))
    anywhere = utc(1990, 1, 1) + timedelta(seconds=draw(st.integers(0, 40 * 365 * 86400)))
    base = draw(st.sampled_from([*TRANSITIONS.get(tz, []), anywhere]))
    return tz, base + timedelta(seconds=draw(st.integers(-20 * 3600, 2 * 3600)),
                                microseconds=draw(st.sampled_from([0, 1, 999999])))


def test_the_transitions_drawn_are_real_jumps_of_the_clock() -> None:
    for tz, instants in TRANSITIONS.items():
        for instant in instants:
            before = (instant - timedelta(seconds=1)).astimezone(ZoneInfo(tz))
            assert before.utcoffset() != instant.astimezone(ZoneInfo(tz)).utcoffset(), tz


@PROPERTY
@given(expressions())
def test_parse_selects_what_the_expression_spells_and_refuses_what_never_fires(
        drawn: tuple[str, Fields]) -> None:
    text, fields = drawn
    if not fields.ever_fire():
        with pytest.raises(CronError, match="would never fire"):
            parse(text)
        return
    schedule = parse(text)
    assert (schedule.minutes, schedule.hours, schedule.days, schedule.months,
            schedule.weekdays) == tuple(tuple(sorted(values)) for values in (
                fields.minutes, fields.hours, fields.days, fields.months, fields.weekdays))
    assert parse(schedule.expression) == schedule


def _schedule(drawn: tuple[str, Fields], tz: str) -> Schedule | None:
    text, fields = drawn
    return parse(text, tz) if fields.ever_fire() else None


@PROPERTY
@given(expressions(), zones_and_times(), st.integers(0, 3 * 86400))
def test_next_after_is_later_monotonic_and_a_time_the_rules_fire_at(
        drawn: tuple[str, Fields], where: tuple[str, datetime], later_s: int) -> None:
    tz, t = where
    schedule = _schedule(drawn, tz)
    if schedule is None:
        return
    first = schedule.next_after(t)
    assert first > t
    assert first.tzinfo is UTC
    assert _fires_at(drawn[1], ZoneInfo(tz), first)
    assert schedule.next_after(t + timedelta(seconds=later_s)) >= first


@PROPERTY
@given(expressions(often_every_day=True), zones_and_times(), st.integers(1, 40))
def test_between_agrees_with_next_after_and_with_the_minute_by_minute_reference(
        drawn: tuple[str, Fields], where: tuple[str, datetime], limit: int) -> None:
    tz, start = where
    schedule = _schedule(drawn, tz)
    if schedule is None:
        return
    end = start + timedelta(hours=24)
    found = schedule.between(start, end, limit=10_000)
    assert found == _reference(drawn[1], ZoneInfo(tz), start, end)
    chained, t = [], start
    while (t := schedule.next_after(t)) <= end:
        chained.append(t)
    assert found == chained
    assert schedule.between(start, end, limit) == found[:limit]
