"""Schedules, pure: cron parsing and validation, the Temporal form of a cron, and fire-time rules.

Cron is standard 5-field (``minute hour day-of-month month day-of-week``, second 0 prepended) or
6/7-field with seconds first (``second minute hour day-of-month month day-of-week [year]``),
evaluated in an IANA timezone. Day-of-month and day-of-week follow classic cron: when both are
restricted a day matching either fires; when either starts with ``*`` both must match.

Temporal's own cron strings differ (its 6-field form ends in a year, and it always ANDs the two
day fields), so :func:`temporal_crons` turns one of ours into explicit 7-field strings whose union
fires at exactly the same times.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from core.errors import BadRequest

MISSED_RUN_POLICIES = ("skip", "catch_up")
DEFAULT_TIMEZONE = "UTC"
DEFAULT_MISSED_RUN_POLICY = "skip"
# A fire that starts more than this after its scheduled time is "missed" (domain.md §11).
MISSED_AFTER = timedelta(seconds=30)
# How far ahead "does this cron ever fire" looks when no year is given (covers leap days).
HORIZON_YEARS = 30

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    names_base: int = 0


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTHS, 1)
_DOW = _Field("day-of-week", 0, 7, _DAYS, 0)  # 7 is Sunday too
_YEAR = _Field("year", 1970, 2999)
_FIELDS = (_SECOND, _MINUTE, _HOUR, _DOM, _MONTH, _DOW, _YEAR)


@dataclass(frozen=True)
class Cron:
    """A parsed cron: the allowed values of each field (``years`` None = every year)."""

    source: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday
    years: frozenset[int] | None
    days_star: bool  # the day-of-month field starts with '*' (or is '?')
    weekdays_star: bool

    def matches_day(self, d: date) -> bool:
        if d.month not in self.months or (self.years is not None and d.year not in self.years):
            return False
        in_days = d.day in self.days
        in_weekdays = (d.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return in_days and in_weekdays
        return in_days or in_weekdays


def _bad(cron: str, why: str) -> BadRequest:
    return BadRequest(f"invalid schedule.cron '{cron}': {why}")


def _value(text: str, f: _Field, cron: str) -> int:
    upper = text.upper()
    if f.names and upper in f.names:
        return f.names.index(upper) + f.names_base
    if any(ch in upper for ch in "LW#?"):
        raise _bad(cron, f"'{text}' in {f.name}: the L, W, # and ? extensions are not supported here")
    if not text.isdigit():
        raise _bad(cron, f"'{text}' is not a valid {f.name} value")
    n = int(text)
    if not f.low <= n <= f.high:
        raise _bad(cron, f"{f.name} value {n} is outside {f.low}-{f.high}")
    return n


def _parse_field(text: str, f: _Field, cron: str) -> tuple[set[int], bool]:
    """The set of values a field allows, and whether it starts with a wildcard."""
    star = text.startswith("*") or text == "?"
    if text == "?":
        if f not in (_DOM, _DOW):
            raise _bad(cron, f"'?' is only allowed in day-of-month and day-of-week, not {f.name}")
        text = "*"
    out: set[int] = set()
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise _bad(cron, f"step '{step_text}' in {f.name} must be a positive integer")
            step = int(step_text)
        if base == "*":
            low, high = f.low, f.high
        elif "-" in base:
            a, _, b = base.partition("-")
            low, high = _value(a, f, cron), _value(b, f, cron)
            if low > high:
                raise _bad(cron, f"{f.name} range {base} runs backwards")
        elif base:
            low = _value(base, f, cron)
            high = f.high if slash else low  # 'x/y' means x, x+y, … up to the field's maximum
        else:
            raise _bad(cron, f"empty item in the {f.name} field")
        out.update(range(low, high + 1, step))
    if f is _DOW:
        out = {d % 7 for d in out}
    return out, star


def parse_cron(cron: str) -> Cron:
    """Parse a cron expression; BadRequest names what is wrong with it."""
    text = " ".join(cron.split())
    if not text:
        raise BadRequest("schedule.cron is required")
    if text.startswith("@"):
        if text.lower() not in _SHORTHANDS:
            raise _bad(cron, f"unknown shorthand (use one of {', '.join(sorted(_SHORTHANDS))})")
        text = _SHORTHANDS[text.lower()]
    parts = text.split(" ")
    if len(parts) == 5:
        parts = ["0", *parts, "*"]
    elif len(parts) == 6:
        parts = [*parts, "*"]
    elif len(parts) != 7:
        raise _bad(cron, f"expected 5, 6 or 7 fields, got {len(parts)}")
    values = [_parse_field(p, f, cron) for p, f in zip(parts, _FIELDS, strict=True)]
    (sec, _), (minute, _), (hour, _), (dom, dom_star), (month, _), (dow, dow_star), (year, year_star) = values
    return Cron(
        source=cron,
        seconds=tuple(sorted(sec)),
        minutes=tuple(sorted(minute)),
        hours=tuple(sorted(hour)),
        days=frozenset(dom),
        months=frozenset(month),
        weekdays=frozenset(dow),
        years=None if year_star and len(year) == _YEAR.high - _YEAR.low + 1 else frozenset(year),
        days_star=dom_star,
        weekdays_star=dow_star,
    )


def _join(values: frozenset[int] | tuple[int, ...] | None, full: int) -> str:
    if values is None or len(values) == full:
        return "*"
    return ",".join(str(v) for v in sorted(values))


def temporal_crons(cron: str) -> list[str]:
    """The 7-field Temporal cron strings (second … year) whose union fires exactly when ``cron`` does.

    Values are spelled out as explicit lists so that nothing depends on how Temporal reads steps,
    names or a Sunday written as 7; classic cron's day-of-month OR day-of-week becomes two strings.
    """
    c = parse_cron(cron)
    head = f"{_join(c.seconds, 60)} {_join(c.minutes, 60)} {_join(c.hours, 24)}"
    months, years = _join(c.months, 12), _join(c.years, 0)
    days, weekdays = _join(c.days, 31), _join(c.weekdays, 7)
    if not (c.days_star or c.weekdays_star):
        return [f"{head} {days} {months} * {years}", f"{head} * {months} {weekdays} {years}"]
    return [f"{head} {days} {months} {weekdays} {years}"]


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def parse_timezone(name: str | None) -> zoneinfo.ZoneInfo:
    """An IANA timezone (None = UTC); BadRequest naming it if unknown."""
    tz = DEFAULT_TIMEZONE if name is None else name
    if tz != "UTC" and tz not in _zones():
        raise BadRequest(f"unknown schedule.timezone '{tz}': use an IANA name such as 'Europe/Berlin' or 'UTC'")
    return zoneinfo.ZoneInfo(tz)


def _instants(wall: datetime, tz: zoneinfo.ZoneInfo) -> list[datetime]:
    """The UTC instants at which the wall clock in ``tz`` shows ``wall`` (naive): 0, 1 or 2."""
    out: list[datetime] = []
    for fold in (0, 1):
        at = wall.replace(tzinfo=tz, fold=fold).astimezone(UTC)
        if at.astimezone(tz).replace(tzinfo=None) == wall and at not in out:
            out.append(at)
    return out


def next_fire(cron: Cron, tz: zoneinfo.ZoneInfo, after: datetime) -> datetime | None:
    """The first fire time strictly after ``after`` (UTC), or None if there is none in the horizon.

    A fire happens whenever the wall clock in ``tz`` shows a matching time, as in Temporal: a wall
    time the clocks pass twice (going back) fires at both instants, one they skip (going forward)
    does not fire that day.
    """
    local_after = after.astimezone(tz)
    start = local_after.date()
    last_year = max(cron.years) if cron.years is not None else start.year + HORIZON_YEARS
    day = start
    while day.year <= last_year:
        if cron.matches_day(day):
            best: datetime | None = None
            found_hour: int | None = None
            for h in cron.hours:
                # Within one day the UTC order of local times can bend by an hour around a DST
                # change: keep looking one hour past the first hit and take the earliest.
                if found_hour is not None and h > found_hour + 1:
                    break
                if day == start and h < local_after.hour - 2:
                    continue  # certainly before ``after`` (a DST shift is at most two hours)
                for m in cron.minutes:
                    for s in cron.seconds:
                        for at in _instants(datetime(day.year, day.month, day.day, h, m, s), tz):
                            if at > after and (best is None or at < best):
                                best = at
                                found_hour = h if found_hour is None else found_hour
            if best is not None:
                return best
        day += timedelta(days=1)
    return None


def validate_schedule(
    cron: str | None,
    timezone: str | None,
    missed_run_policy: str | None,
    *,
    now: datetime | None = None,
) -> None:
    """Refuse a bad schedule with a BadRequest naming the field: ``schedule.cron`` (syntax, or it
    never fires after ``now``), ``schedule.timezone`` or ``schedule.missed_run_policy``.

    Without ``now`` the "fires in the future" check is skipped (core reads no clock); callers
    creating or changing a schedule pass the current time.
    """
    if cron is None or not cron.strip():
        raise BadRequest("schedule.cron is required")
    parsed = parse_cron(cron)
    tz = parse_timezone(timezone)
    if missed_run_policy is not None and missed_run_policy not in MISSED_RUN_POLICIES:
        raise BadRequest(
            f"unknown schedule.missed_run_policy '{missed_run_policy}': use one of {', '.join(MISSED_RUN_POLICIES)}"
        )
    after = now if now is not None else datetime(2000, 1, 1, tzinfo=UTC)
    if next_fire(parsed, tz, after) is None:
        raise BadRequest(f"schedule.cron '{cron}' never fires in the future")


def fire_time_text(at: datetime) -> str:
    """A fire time as it appears in ``{{fire_time}}`` and the fire key: UTC, whole seconds, ``Z``."""
    return at.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def fire_key(at: datetime) -> str:
    """The idempotency key of the fire scheduled at ``at`` (domain.md §11: ``sched:<fire time>``)."""
    return f"sched:{fire_time_text(at)}"


def is_missed(scheduled: datetime, started: datetime) -> bool:
    return started - scheduled > MISSED_AFTER


def fire_key_time(key: str) -> datetime | None:
    """The fire time a ``sched:`` key names (None for any other key)."""
    if not key.startswith("sched:"):
        return None
    try:
        at = datetime.fromisoformat(key.removeprefix("sched:"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


@dataclass(frozen=True)
class FireRecord:
    """One recorded schedule fire: its nominal ``fire_time``, whether it was handled as missed (a
    ``missed`` skip or a ``catch_up`` fire), and when it was recorded."""

    fire_time: datetime
    late: bool
    recorded_at: datetime


def covered_until(records: list[FireRecord], changed_at: datetime) -> datetime:
    """Up to when the schedule's fires are accounted for.

    An on-time fire accounts for its own fire time. A missed fire stands for the whole gap up to the
    moment it was handled (overlap SKIP dropped every fire while it was held), so it accounts up to
    ``recorded_at``. ``changed_at`` (the subscription's last edit) is a floor: a new cron, or a
    re-enable (which backfills its own paused interval), never makes a gap out of the time before.
    """
    marks = [r.recorded_at if r.late else r.fire_time for r in records]
    return max([changed_at, *marks])


def unaccounted_fire(
    cron: Cron, tz: zoneinfo.ZoneInfo, covered: datetime, fire_time: datetime, now: datetime
) -> datetime | None:
    """The oldest fire time before ``fire_time`` that nothing accounts for and that is missed by now
    (more than :data:`MISSED_AFTER` ago), or None. A fire dropped only moments ago (overlap SKIP while
    the previous fire was finishing) is not a gap."""
    first = next_fire(cron, tz, covered)
    if first is None or first >= fire_time or not is_missed(first, now):
        return None
    return first
