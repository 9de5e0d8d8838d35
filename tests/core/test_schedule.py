"""Schedule validation and cron evaluation (pure): what is refused and why, what Temporal is given,
and when a cron fires (DST included). Temporal's agreement with these times is checked against the
real dev server in tests/workflows/test_schedules.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import BadRequest
from core.schedule import (
    FireRecord,
    covered_until,
    fire_key,
    fire_key_time,
    fire_time_text,
    is_missed,
    next_fire,
    parse_cron,
    parse_timezone,
    temporal_crons,
    unaccounted_fire,
    validate_schedule,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def fires(cron: str, tz: str, after: datetime, n: int) -> list[str]:
    out, t = [], after
    for _ in range(n):
        nxt = next_fire(parse_cron(cron), parse_timezone(tz), t)
        assert nxt is not None
        out.append(nxt.strftime("%Y-%m-%dT%H:%M:%SZ"))
        t = nxt
    return out


# ---- what Temporal is given ---------------------------------------------------------------------


def test_five_fields_get_second_zero_and_any_year() -> None:
    assert temporal_crons("*/15 9-17 * * MON-FRI") == ["0 0,15,30,45 9,10,11,12,13,14,15,16,17 * * 1,2,3,4,5 *"]


def test_six_fields_start_with_seconds_and_seven_end_with_the_year() -> None:
    assert temporal_crons("30 0 12 * * *") == ["30 0 12 * * * *"]
    assert temporal_crons("0 0 12 1 JAN * 2027-2028") == ["0 0 12 1 1 * 2027,2028"]


def test_both_day_fields_restricted_fire_on_either_like_classic_cron() -> None:
    assert temporal_crons("0 9 1 * MON") == ["0 0 9 1 * * *", "0 0 9 * * 1 *"]
    # A day field starting with '*' makes it an AND again.
    assert temporal_crons("0 9 */10 * MON") == ["0 0 9 1,11,21,31 * 1 *"]
    assert fires("0 9 1 * MON", "UTC", datetime(2026, 5, 29, tzinfo=UTC), 3) == [
        "2026-06-01T09:00:00Z",  # the 1st (a Monday too)
        "2026-06-08T09:00:00Z",
        "2026-06-15T09:00:00Z",
    ]


def test_names_sunday_as_seven_and_shorthands() -> None:
    assert temporal_crons("0 0 * * 7") == temporal_crons("0 0 * * SUN") == ["0 0 0 * * 0 *"]
    assert temporal_crons("@daily") == ["0 0 0 * * * *"]
    assert temporal_crons("@hourly") == ["0 0 * * * * *"]
    assert temporal_crons("0 0 1 jan,Jul *") == ["0 0 0 1 1,7 * *"]


# ---- refusals name the field --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        ("", "schedule.cron is required"),
        ("* * *", "expected 5, 6 or 7 fields, got 3"),
        ("61 * * * *", "minute value 61 is outside 0-59"),
        ("0 24 * * *", "hour value 24 is outside 0-23"),
        ("0 0 0 * * * 1969", "year value 1969 is outside 1970-2999"),
        ("5-1 * * * *", "minute range 5-1 runs backwards"),
        ("*/0 * * * *", "step '0' in minute must be a positive integer"),
        ("0 0 L * *", "extensions are not supported"),
        ("0 0 * * MON#2", "extensions are not supported"),
        ("? * * * *", "'?' is only allowed in day-of-month and day-of-week"),
        ("0 0 * FOO *", "'FOO' is not a valid month value"),
        ("@reboot", "unknown shorthand"),
        ("1,,2 * * * *", "empty item in the minute field"),
        ("0 0 31 2 *", "never fires in the future"),
        ("0 0 12 1 1 * 2020", "never fires in the future"),
    ],
)
def test_a_bad_cron_is_refused_naming_schedule_cron(cron: str, why: str) -> None:
    with pytest.raises(BadRequest) as err:
        validate_schedule(cron, "UTC", "skip", now=NOW)
    assert "schedule.cron" in err.value.message and why in err.value.message


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "", "utc", "../../etc/passwd", "Europe/"])
def test_an_unknown_timezone_is_refused_naming_schedule_timezone(tz: str) -> None:
    with pytest.raises(BadRequest) as err:
        validate_schedule("0 9 * * *", tz, "skip", now=NOW)
    assert err.value.message.startswith(f"unknown schedule.timezone '{tz}'")


@pytest.mark.parametrize("policy", ["sometimes", "SKIP", "catchup", ""])
def test_an_unknown_missed_run_policy_is_refused_naming_it(policy: str) -> None:
    with pytest.raises(BadRequest) as err:
        validate_schedule("0 9 * * *", "UTC", policy, now=NOW)
    assert err.value.message == f"unknown schedule.missed_run_policy '{policy}': use one of skip, catch_up"


def test_good_schedules_pass_and_the_defaults_are_utc_and_skip() -> None:
    validate_schedule("0 9 * * MON-FRI", "Europe/Berlin", "catch_up", now=NOW)
    validate_schedule("*/5 * * * * *", None, None, now=NOW)
    validate_schedule("0 0 12 1 1 * 2027", "America/New_York", "skip", now=NOW)
    validate_schedule("0 0 12 1 1 * 2020", "UTC", "skip")  # without a clock only "fires at all" is checked


# ---- when it fires ------------------------------------------------------------------------------


def test_the_timezone_decides_the_instant_and_dst_moves_it() -> None:
    # New York springs forward on 2026-03-08: 09:00 local is 14:00Z before and 13:00Z after.
    assert fires("0 9 * * *", "America/New_York", datetime(2026, 3, 6, tzinfo=UTC), 4) == [
        "2026-03-06T14:00:00Z",
        "2026-03-07T14:00:00Z",
        "2026-03-08T13:00:00Z",
        "2026-03-09T13:00:00Z",
    ]


def test_a_skipped_wall_time_does_not_fire_and_a_repeated_one_fires_twice() -> None:
    # 02:30 does not exist in New York on 2026-03-08; 01:30 happens twice on 2026-11-01.
    assert fires("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC), 2) == [
        "2026-03-09T06:30:00Z",
        "2026-03-10T06:30:00Z",
    ]
    assert fires("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12, tzinfo=UTC), 3) == [
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-02T06:30:00Z",
    ]


def test_seconds_and_leap_days() -> None:
    assert fires("*/20 * * * * *", "UTC", datetime(2026, 1, 1, 0, 0, 50, tzinfo=UTC), 3) == [
        "2026-01-01T00:01:00Z",
        "2026-01-01T00:01:20Z",
        "2026-01-01T00:01:40Z",
    ]
    assert fires("0 0 29 2 *", "UTC", NOW, 2) == ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]


MINUTE = st.sets(st.integers(0, 59), min_size=1, max_size=4)
HOUR = st.sets(st.integers(0, 23), min_size=1, max_size=4)
DOW = st.sets(st.integers(0, 6), min_size=1, max_size=7)


@settings(max_examples=60, deadline=None)
@given(MINUTE, HOUR, DOW, st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2030, 1, 1)))
def test_next_fire_is_the_first_matching_minute(
    minutes: set[int], hours: set[int], weekdays: set[int], after: datetime
) -> None:
    """Against a brute-force scan, minute by minute, in UTC."""
    cron = f"{','.join(map(str, minutes))} {','.join(map(str, hours))} * * {','.join(map(str, weekdays))}"
    start = after.replace(tzinfo=UTC)
    t = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while not (t.minute in minutes and t.hour in hours and (t.isoweekday() % 7) in weekdays):
        t += timedelta(minutes=1)
    assert next_fire(parse_cron(cron), parse_timezone("UTC"), start) == t


# ---- fire keys ----------------------------------------------------------------------------------


def test_the_fire_key_is_the_utc_fire_time_in_whole_seconds() -> None:
    at = datetime(2026, 3, 8, 9, 0, 0, 873000, tzinfo=parse_timezone("America/New_York"))
    assert fire_time_text(at) == "2026-03-08T13:00:00Z"
    assert fire_key(at) == "sched:2026-03-08T13:00:00Z"


def test_a_fire_is_missed_only_when_more_than_30_seconds_late() -> None:
    assert not is_missed(NOW, NOW + timedelta(seconds=30))
    assert is_missed(NOW, NOW + timedelta(seconds=30, milliseconds=1))


def _gap(records: list[FireRecord], changed_at: datetime, fire_time: datetime, now: datetime) -> datetime | None:
    cron, tz = parse_cron("0 * * * * *"), parse_timezone("UTC")  # every minute
    return unaccounted_fire(cron, tz, covered_until(records, changed_at), fire_time, now)


def test_a_gap_nothing_recorded_is_found_at_its_oldest_fire_time() -> None:
    """An on-time fire at 10:00 stayed open through an outage; the next fire Temporal starts is
    10:05: the fires from 10:01 were dropped, and 10:01 is the gap's oldest time."""
    t = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    on_time = [FireRecord(fire_time=t, late=False, recorded_at=t + timedelta(seconds=1))]
    edited = t - timedelta(days=1)
    later = t + timedelta(minutes=5)
    assert _gap(on_time, edited, later, later + timedelta(seconds=1)) == t + timedelta(minutes=1)
    # The next fire right after the last one: nothing missed.
    assert _gap(on_time, edited, t + timedelta(minutes=1), t + timedelta(minutes=1, seconds=1)) is None
    # A fire dropped moments ago (the previous fire still finishing) is not a gap yet.
    assert _gap(on_time, edited, t + timedelta(minutes=2), t + timedelta(minutes=1, seconds=20)) is None


def test_a_missed_fire_covers_its_gap_up_to_its_handling_and_an_edit_covers_the_time_before() -> None:
    t = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    handled = t + timedelta(minutes=7, seconds=30)
    late = [FireRecord(fire_time=t + timedelta(minutes=1), late=True, recorded_at=handled)]
    nxt = t + timedelta(minutes=8)
    assert _gap(late, t - timedelta(days=1), nxt, nxt + timedelta(seconds=1)) is None
    # A new cron or a re-enable at 10:20 makes no gap of the time before it.
    on_time = [FireRecord(fire_time=t, late=False, recorded_at=t)]
    edit = t + timedelta(minutes=20, seconds=10)
    assert _gap(on_time, edit, t + timedelta(minutes=21), t + timedelta(minutes=21, seconds=1)) is None
    assert covered_until([], edit) == edit


def test_a_fire_key_names_its_time() -> None:
    t = datetime(2026, 3, 8, 13, 0, tzinfo=UTC)
    assert fire_key_time(fire_key(t)) == t
    assert fire_key_time("run-now:abc") is None and fire_key_time("sched:not-a-time") is None
