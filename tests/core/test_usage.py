"""The usage meters and the reservation arithmetic (pure; the wire bytes come from the scripted upstream)."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from core.usage import (
    DEFAULT_MAX_OUTPUT,
    MAX_OUTPUT_CAP,
    BodyMeter,
    Dialect,
    Spend,
    SseMeter,
    Usage,
    admit,
    declared_max_output,
    exhausted,
    parse_response_usage,
    reserved_tokens,
)
from tests.llm_upstream import Usage as Declared
from tests.llm_upstream import anthropic_events, anthropic_message, openai_events, openai_response, text, tool_use

DECLARED = Declared(input=1234, output=567, cache_read=8910, cache_write=111)
EXPECTED = Usage(input_tokens=1234, output_tokens=567, cache_read_tokens=8910, cache_write_tokens=111)


def _feed(meter: SseMeter, data: bytes, cuts: list[int]) -> None:
    last = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        meter.feed(data[last:cut])
        last = cut
    meter.feed(data[last:])


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=40), tool=st.booleans())
def test_anthropic_stream_meters_the_reported_usage_however_it_is_chunked(cuts: list[int], tool: bool) -> None:
    turn = tool_use("Bash", {"command": "ls -la"}, usage=DECLARED) if tool else text("a b c", usage=DECLARED)
    data = b"".join(anthropic_events(turn, "claude-haiku-4-5"))
    meter = SseMeter(Dialect.ANTHROPIC)
    _feed(meter, data, cuts)
    assert meter.result() == EXPECTED


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=40))
def test_openai_stream_splits_cached_input_out_of_input(cuts: list[int]) -> None:
    turn = text("hello there", usage=Declared(input=100, output=7, cache_read=900))
    data = b"".join(openai_events(turn, "gpt-5.4-mini"))
    meter = SseMeter(Dialect.OPENAI)
    _feed(meter, data, cuts)
    assert meter.result() == Usage(input_tokens=100, output_tokens=7, cache_read_tokens=900)


def test_anthropic_delta_usage_is_cumulative_and_overrides_the_start() -> None:
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 40, "input_tokens": 6, "cache_read_input_tokens": 3}}
    raw = b"".join(f"event: {d['type']}\r\ndata: {json.dumps(d)}\r\n\r\n".encode() for d in (start, delta))
    meter = SseMeter(Dialect.ANTHROPIC)
    meter.feed(raw)
    assert meter.result() == Usage(input_tokens=6, output_tokens=40, cache_read_tokens=3)


def test_incomplete_or_usage_free_streams_are_none_never_zero() -> None:
    events = anthropic_events(text("hi", usage=DECLARED), "m")
    cut = SseMeter(Dialect.ANTHROPIC)
    for chunk in events[:3]:  # message_start and a little content, then the stream dies
        cut.feed(chunk)
    assert cut.result() is None

    bare = SseMeter(Dialect.ANTHROPIC)
    for chunk in anthropic_events(text("hi", omit_usage=True), "m"):
        bare.feed(chunk)
    assert bare.result() is None

    openai_bare = SseMeter(Dialect.OPENAI)
    for chunk in openai_events(text("hi", omit_usage=True), "g"):
        openai_bare.feed(chunk)
    assert openai_bare.result() is None


def test_a_garbled_usage_event_breaks_the_meter() -> None:
    meter = SseMeter(Dialect.ANTHROPIC)
    for chunk in anthropic_events(text("hi", usage=DECLARED), "m"):
        meter.feed(chunk)
    meter.feed(b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens": 9\n\n')
    assert meter.result() is None


def test_non_streaming_bodies() -> None:
    doc = json.dumps(anthropic_message(text("hi", usage=DECLARED), "m")).encode()
    assert parse_response_usage(Dialect.ANTHROPIC, doc) == EXPECTED
    body = BodyMeter(Dialect.ANTHROPIC)
    for i in range(0, len(doc), 7):
        body.feed(doc[i : i + 7])
    assert body.result() == EXPECTED
    resp = json.dumps(openai_response(text("hi", usage=Declared(input=3, output=4, cache_read=5)), "g")).encode()
    assert parse_response_usage(Dialect.OPENAI, resp) == Usage(3, 4, 5, 0)
    assert parse_response_usage(Dialect.ANTHROPIC, b"not json") is None
    assert (
        parse_response_usage(Dialect.ANTHROPIC, json.dumps(anthropic_message(text("x", omit_usage=True), "m")).encode())
        is None
    )
    assert parse_response_usage(Dialect.ANTHROPIC, b'{"usage":{"input_tokens":-1,"output_tokens":2}}') is None


def test_reservation_size_is_body_bytes_plus_declared_output() -> None:
    assert declared_max_output(Dialect.ANTHROPIC, {"max_tokens": 1000}) == 1000
    assert declared_max_output(Dialect.ANTHROPIC, {}) == DEFAULT_MAX_OUTPUT
    assert declared_max_output(Dialect.ANTHROPIC, {"max_tokens": "lots"}) == DEFAULT_MAX_OUTPUT
    assert declared_max_output(Dialect.ANTHROPIC, {"max_tokens": 10**9}) == MAX_OUTPUT_CAP
    assert declared_max_output(Dialect.OPENAI, {"max_output_tokens": 77, "max_tokens": 5}) == 77
    assert reserved_tokens(Dialect.ANTHROPIC, {"max_tokens": 100}, 2048) == 2148


def _spend(used: int = 0, live: int = 0, live_tokens: int = 0, cost: str | None = None, live_cost: str = "0") -> Spend:
    return Spend(used, None if cost is None else Decimal(cost), live, live_tokens, Decimal(live_cost))


def test_admission_fits_used_plus_reserved_plus_this_exactly() -> None:
    caps = {"max_tokens": 1000, "max_cost": None, "ceiling": 32}
    assert admit(_spend(used=400, live=1, live_tokens=300), 300, None, **caps).admitted  # 1000: fits exactly
    refused = admit(_spend(used=400, live=1, live_tokens=300), 301, None, **caps)
    assert not refused.admitted and refused.code == "llm_budget_reservation_exceeded"


def test_the_lone_request_is_admitted_even_over_the_remaining_budget() -> None:
    assert admit(_spend(used=990), 5000, Decimal("3"), max_tokens=1000, max_cost=1.0, ceiling=32).admitted


def test_the_in_flight_ceiling_binds_first() -> None:
    out = admit(_spend(live=2, live_tokens=2), 1, None, max_tokens=None, max_cost=None, ceiling=2)
    assert not out.admitted and out.code == "llm_reservation_ceiling_exceeded"


def test_cost_cap_binds_only_priced_requests() -> None:
    spend = _spend(live=1, cost="0.50", live_cost="0.25")
    assert not admit(spend, 1, Decimal("0.26"), max_tokens=None, max_cost=1.0, ceiling=32).admitted
    assert admit(spend, 1, Decimal("0.25"), max_tokens=None, max_cost=1.0, ceiling=32).admitted
    assert admit(spend, 1, None, max_tokens=None, max_cost=1.0, ceiling=32).admitted  # unpriced model


def test_exhaustion_is_at_or_over_the_cap_cost_first() -> None:
    assert exhausted(_spend(used=999), 1000, None) is None
    assert exhausted(_spend(used=1000), 1000, None) == "max_tokens"
    assert exhausted(_spend(used=1000, cost="2.5"), 1000, 2.5) == "max_cost_usd"
    assert exhausted(_spend(used=10, cost="2.49"), 1000, 2.5) is None
    assert exhausted(_spend(used=10**9), None, 1.0) is None  # uncapped tokens, nothing priced
