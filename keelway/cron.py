"""Cron schedules: the five-field expressions of scheduled jobs, and when they fire.

A Schedule is pure: `parse` turns text into one or raises CronError naming the field and
the part to fix; `next_after` and `between` say when it fires, with no clock and no I/O,
so the same schedule always yields the same scheduled times to journal runs under.

The rules, all of them here:
- Fields are minute hour day-of-month month day-of-week. Each is `*`, a value, a range
  `a-b`, a step over `*` or a range (`*/15`, `10-50/10`), or a list of those. Months and
  weekdays take names (`jan`, `mon`) in any case; weekday 7 is Sunday, and Sunday closing
  a range counts as 7, so `fri-sun` is the weekend.
- A day field is restricted when its values leave out some day. When both day fields
  are, a day matches if either does (`0 0 1 * mon`: the 1st and every Monday), as classic
  cron has it. Vixie cron decides "restricted" by whether the text starts with `*`, so it
  reads `*/2` as unrestricted; here the values decide, so a field means what it selects
  however it is spelt, and `describe()` can print it in another spelling.
- A schedule that could never fire (`0 0 30 2 *`) is refused by `parse`. Every Schedule
  therefore fires, at the latest eight years on (a leap day across 2100), and the search
  for its next time is bounded.
- Fields are read in the schedule's timezone; fire times are UTC instants, and each
  instant fires at most once. A local time skipped by a spring-forward fires at the first
  instant after the gap (02:30 on a night that jumps 02:00 -> 03:00 fires at 03:00); a
  local time that happens twice in a fall-back fires at its first occurrence only. So a
  sub-hourly job in a local timezone pauses through the repeated hour; a job that must
  keep a steady interval belongs in UTC.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from dataclasses import dataclass
from datetime import MAXYEAR, UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_ONE_MINUTE = timedelta(minutes=1)
_ONE_SECOND = timedelta(seconds=1)

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


class CronError(ValueError):
    """An expression or timezone that cannot be a schedule: the user's to fix, and the
    message says which field and which part."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int  # the highest distinct value
    highest_written: int  # past `high` only for weekday 7, which is Sunday again
    names: tuple[str, ...] = ()  # names[i] spells the value low + i

    def spell(self, value: int) -> str:
        return self.names[value - self.low] if self.names else str(value)


_MINUTES = _Field("minute", 0, 59, 59)
_HOURS = _Field("hour", 0, 23, 23)
_DAYS = _Field("day-of-month", 1, 31, 31)
_MONTHS = _Field("month", 1, 12, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug",
                                     "sep", "oct", "nov", "dec"))
_WEEKDAYS = _Field("day-of-week", 0, 6, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
_FIELDS = (_MINUTES, _HOURS, _DAYS, _MONTHS, _WEEKDAYS)
_LONGEST_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # by month, leap years


def parse(text: str, tz: str = "UTC") -> Schedule:
    """The schedule `text` describes, read in timezone `tz` (an IANA name).

    Raises CronError, and nothing else, for anything that is not a schedule that fires:
    a wrong number of fields, an empty list item, a step of 0, a reversed range, a value
    out of range, an unknown name or macro, a stray character, a day that no month of
    the schedule has, an unknown timezone.
    """
    zone = _zone(tz)
    words = text.split()
    if not words:
        raise CronError("the schedule is empty; write five fields such as '*/15 * * * *'")
    if words[0].startswith("@"):
        macro = words[0].lower()
        if macro not in MACROS:
            raise CronError(f"unknown macro {_shown(words[0])}; use one of "
                            f"{', '.join(MACROS)} or five fields")
        if len(words) > 1:
            raise CronError(f"{words[0]} stands alone; found {_shown(text.strip())}")
        words = MACROS[macro].split()
    if len(words) != 5:
        raise CronError(f"expected 5 fields (minute hour day-of-month month day-of-week), "
                        f"got {len(words)} in {_shown(text.strip())}")
    minutes, hours, days, months, weekdays = (
        tuple(sorted(_read_field(f, word))) for f, word in zip(_FIELDS, words, strict=True))
    schedule = Schedule(minutes, hours, days, months, weekdays, zone)
    _check_fires(schedule)
    return schedule


@dataclass(frozen=True)
class Schedule:
    """When a job fires: the values each field selects (sorted; weekday 0 is Sunday) and
    the timezone they are read in. Build one with `parse`, which guarantees it fires."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    zone: ZoneInfo

    def next_after(self, t: datetime) -> datetime:
        """The first fire time strictly after `t`, in UTC.

        There is always one, since parse refuses schedules that never fire; the search
        skips whole months, days and hours, never minute by minute, so its work is
        bounded. `t` must be timezone-aware (ValueError otherwise); OverflowError if the
        next fire time would fall past the year 9999.
        """
        after = _utc(t, "t")
        wall = after.astimezone(self.zone).replace(tzinfo=None, fold=0, second=0,
                                                   microsecond=0)
        while True:
            # Instants never fall as wall times rise (the first occurrence in an
            # overlap, the gap's end in a gap), and no wall time before t's own maps
            # past t. So the answer is the first matching wall time from t's whose
            # instant is past t; the ones passed over are first occurrences when t is in
            # an overlap's second, at most an overlap's worth.
            wall = self._wall_at_or_after(wall)
            instant = self._instant(wall)
            if instant > after:
                return instant
            wall += _ONE_MINUTE

    def between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """The fire times in (start, end], earliest first, at most `limit` of them: the
        runs missed while nothing was watching. Both bounds must be timezone-aware."""
        if limit < 0:
            raise ValueError(f"limit must not be negative, got {limit}")
        last = _utc(end, "end")
        fires: list[datetime] = []
        t = _utc(start, "start")
        while len(fires) < limit:
            t = self.next_after(t)
            if t > last:
                break
            fires.append(t)
        return fires

    @property
    def expression(self) -> str:
        """The five fields in one spelling: what parses back to this schedule."""
        fields = (self.minutes, self.hours, self.days, self.months, self.weekdays)
        return " ".join(_spell(f, values) for f, values in zip(_FIELDS, fields, strict=True))

    def describe(self) -> str:
        """The normalized expression and its timezone, as `keelway jobs` shows them."""
        return f"{self.expression} ({self.zone.key})"

    def __str__(self) -> str:
        return self.describe()

    def _wall_at_or_after(self, start: datetime) -> datetime:
        """The first local wall time at or after `start` (a naive whole minute) that
        every field matches."""
        year, month, day = start.year, start.month, start.day
        hour, minute = start.hour, start.minute
        while True:
            # Each pass returns or moves on to a later month, day or hour, starting the
            # smaller units afresh; parse refused schedules with no day to fire on, so a
            # match comes within eight years.
            if year > MAXYEAR:
                raise OverflowError("no fire time before the end of the year 9999")
            found_month = _at_least(self.months, month)
            if found_month is None:
                year, month, day, hour, minute = year + 1, 1, 1, 0, 0
                continue
            if found_month != month:
                month, day, hour, minute = found_month, 1, 0, 0
            found_day = self._matching_day(year, month, day)
            if found_day is None:
                month, day, hour, minute = month + 1, 1, 0, 0
                continue
            if found_day != day:
                day, hour, minute = found_day, 0, 0
            found_hour = _at_least(self.hours, hour)
            if found_hour is None:
                day, hour, minute = day + 1, 0, 0
                continue
            if found_hour != hour:
                hour, minute = found_hour, 0
            found_minute = _at_least(self.minutes, minute)
            if found_minute is None:
                hour, minute = hour + 1, 0
                continue
            return datetime(year, month, day, hour, found_minute)

    def _matching_day(self, year: int, month: int, day: int) -> int | None:
        """The first day of the month from `day` on that the day fields match."""
        first_weekday, length = calendar.monthrange(year, month)  # of the 1st; Monday is 0
        either = len(self.days) < 31 and len(self.weekdays) < 7
        for candidate in range(day, length + 1):
            in_days = candidate in self.days
            # Cron's weekday (Sunday 0) is one more than Python's (Monday 0).
            on_weekday = (first_weekday + candidate) % 7 in self.weekdays
            if (in_days or on_weekday) if either else (in_days and on_weekday):
                return candidate
        return None

    def _instant(self, wall: datetime) -> datetime:
        """When local wall time `wall` fires: its first occurrence, or the end of the
        gap it falls in."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if first.astimezone(self.zone).replace(tzinfo=None) == wall:
            return first
        # In a gap, fold=0 reads the wall time with the offset from before the gap, which
        # lands past the gap's end, and fold=1 with the offset from after, which lands
        # before its start. zoneinfo does not expose the transition between, so it is
        # found by halving, in whole seconds as tzdata's transitions are (about 17 steps
        # for a gap of a day).
        before = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        within_s, past_s = 0, (first - before) // _ONE_SECOND
        while past_s - within_s > 1:
            middle_s = (within_s + past_s) // 2
            middle = before + middle_s * _ONE_SECOND
            if middle.astimezone(self.zone).replace(tzinfo=None) > wall:
                past_s = middle_s
            else:
                within_s = middle_s
        return before + past_s * _ONE_SECOND


def _utc(t: datetime, what: str) -> datetime:
    if t.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {t!r}")
    # Compared in UTC: Python compares datetimes of one zone by wall time, fold ignored.
    return t.astimezone(UTC)


def _at_least(values: tuple[int, ...], value: int) -> int | None:
    index = bisect_left(values, value)
    return values[index] if index < len(values) else None


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    # What zoneinfo raises for a name it cannot find, cannot accept as a path, or finds
    # to be no zone file (a directory, zone.tab).
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"timezone: unknown name {_shown(tz)}; use an IANA name such as "
                        f"UTC or Europe/Berlin") from exc


def _read_field(field: _Field, word: str) -> set[int]:
    for char in word:
        if not (char.isascii() and (char.isalnum() or char in "*,-/")):
            raise CronError(f"{field.name}: unexpected character {char!r} in {_shown(word)}")
    values: set[int] = set()
    for item in word.split(","):
        if not item:
            raise CronError(f"{field.name}: empty item in the list {_shown(word)}")
        values |= _read_item(field, item)
    return values


def _read_item(field: _Field, item: str) -> set[int]:
    base, slash, step_text = item.partition("/")
    if base == "*":
        low, high = field.low, field.high
    elif "-" in base:
        first, _, last = base.partition("-")
        if not first or not last or "-" in last:
            raise CronError(f"{field.name}: cannot read {_shown(item)}; a range is two "
                            f"values such as {field.spell(field.low)}-{field.spell(field.high)}")
        low, high = _read_value(field, first), _read_value(field, last)
        if field is _WEEKDAYS and high == 0 < low:
            high = 7
        if low > high:
            raise CronError(f"{field.name}: the range {_shown(item)} runs backwards; write "
                            f"the lower value first, or a list of two ranges to wrap around")
    elif not base:
        raise CronError(f"{field.name}: nothing before '/' in {_shown(item)}")
    elif slash:
        # Cron dialects disagree on `5/15` (only 5, or 5-59/15); neither is guessed.
        raise CronError(f"{field.name}: a step needs * or a range before it: write "
                        f"{base}-{field.highest_written}/{step_text} or {base}, not "
                        f"{_shown(item)}")
    else:
        low = high = _read_value(field, base)
    step = _read_step(field, step_text, item) if slash else 1
    return {value % 7 if field is _WEEKDAYS else value for value in range(low, high + 1, step)}


def _read_value(field: _Field, text: str) -> int:
    if text.isdigit():
        # Four digits at most before int(): a longer run is out of range anyway, and
        # int() itself refuses (ValueError) strings past 4,300 digits.
        if len(text) > 4 or not field.low <= int(text) <= field.highest_written:
            shown = str(int(text)) if len(text) <= 4 else _shown(text)
            raise CronError(f"{field.name}: {shown} is out of range "
                            f"{field.low}-{field.highest_written}")
        return int(text)
    if text.isalpha() and field.names:
        if text.lower() in field.names:
            return field.low + field.names.index(text.lower())
        raise CronError(f"{field.name}: unknown name {_shown(text)}; use "
                        f"{field.names[0]}..{field.names[-1]} or "
                        f"{field.low}-{field.highest_written}")
    raise CronError(f"{field.name}: {_shown(text)} is not a number "
                    f"({field.low}-{field.highest_written})")


def _read_step(field: _Field, text: str, item: str) -> int:
    # A step wider than the field selects only its start, which is the start written
    # plainly; so steps run 1 to the field's width.
    widest = field.high - field.low
    if not text:
        raise CronError(f"{field.name}: no step after '/' in {_shown(item)}")
    if not text.isdigit():
        raise CronError(f"{field.name}: the step {_shown(text)} in {_shown(item)} is not "
                        f"a number")
    if len(text) > 4 or not 1 <= int(text) <= widest:
        shown = str(int(text)) if len(text) <= 4 else _shown(text)
        raise CronError(f"{field.name}: the step {shown} in {_shown(item)} is out of range "
                        f"1-{widest}")
    return int(text)


def _check_fires(schedule: Schedule) -> None:
    # Only day-of-month alone can select nothing: every month has every weekday, and
    # when both day fields are restricted either one suffices.
    if len(schedule.days) == 31 or len(schedule.weekdays) < 7:
        return
    if any(schedule.days[0] <= _LONGEST_MONTH[month] for month in schedule.months):
        return
    raise CronError(f"day-of-month: {_spell(_DAYS, schedule.days)} never falls in "
                    f"{_spell(_MONTHS, schedule.months)}, so the schedule would never fire")


def _spell(field: _Field, values: tuple[int, ...]) -> str:
    """`values` as one field of an expression: `*`, a step, or a list of values and
    runs."""
    everything = tuple(range(field.low, field.high + 1))
    if values == everything:
        return "*"
    if len(values) >= 3:
        step = values[1] - values[0]
        if step > 1 and values == tuple(range(values[0], values[-1] + 1, step)):
            if values == everything[::step]:
                return f"*/{step}"
            return f"{field.spell(values[0])}-{field.spell(values[-1])}/{step}"
    parts: list[str] = []
    run_start = 0
    for index in range(1, len(values) + 1):
        if index < len(values) and values[index] == values[index - 1] + 1:
            continue
        run = values[run_start:index]
        if len(run) >= 3:
            parts.append(f"{field.spell(run[0])}-{field.spell(run[-1])}")
        else:
            parts.extend(field.spell(value) for value in run)
        run_start = index
    return ",".join(parts)


def _shown(text: str) -> str:
    """`text` quoted for a message, cut short so a pasted page stays a line."""
    return repr(text if len(text) <= 40 else text[:40] + "...")
