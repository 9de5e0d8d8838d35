"""Model usage: what a response cost in tokens, metered from the bytes the upstream sent.

Two dialects. Anthropic Messages reports usage in ``message_start.message.usage`` (input and cache
counts) and ``message_delta.usage`` (cumulative output, sometimes refreshed input counts). OpenAI
Responses reports it once, in ``response.completed.response.usage``, where ``input_tokens`` includes
the cached part (``input_tokens_details.cached_tokens``); we split it so ``input_tokens`` always
means uncached input, as in Anthropic's accounting.

A meter that never saw a complete usage report answers ``None``, never zero: unparsed usage must
keep its reservation rather than count as free.

Reservation sizing and the admission rule (domain §8) are pure arithmetic and live here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any

DEFAULT_MAX_OUTPUT = 32_768
MAX_OUTPUT_CAP = 1_000_000
# One SSE event larger than this is not a usage report we can trust to parse; the meter gives up
# (the stream itself still flows through untouched).
MAX_EVENT_BYTES = 4 * 1024 * 1024


class Dialect(StrEnum):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        """What a token cap counts: input + output + cache read + cache write."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def anthropic_usage(doc: Any) -> Usage | None:
    """Usage from an Anthropic ``usage`` object (``input_tokens`` and ``output_tokens`` required)."""
    if not isinstance(doc, dict):
        return None
    inp, out = _count(doc.get("input_tokens")), _count(doc.get("output_tokens"))
    if inp is None or out is None:
        return None
    return Usage(
        input_tokens=inp,
        output_tokens=out,
        cache_read_tokens=_count(doc.get("cache_read_input_tokens")) or 0,
        cache_write_tokens=_count(doc.get("cache_creation_input_tokens")) or 0,
    )


def openai_usage(doc: Any) -> Usage | None:
    """Usage from an OpenAI Responses ``usage`` object; cached input is split out of ``input_tokens``."""
    if not isinstance(doc, dict):
        return None
    inp, out = _count(doc.get("input_tokens")), _count(doc.get("output_tokens"))
    if inp is None or out is None:
        return None
    details = doc.get("input_tokens_details")
    cached = (_count(details.get("cached_tokens")) or 0) if isinstance(details, dict) else 0
    cached = min(cached, inp)
    return Usage(input_tokens=inp - cached, output_tokens=out, cache_read_tokens=cached)


def parse_response_usage(dialect: Dialect, body: bytes) -> Usage | None:
    """Usage of a non-streaming response body (the whole JSON document)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    if dialect is Dialect.OPENAI:
        return openai_usage(doc.get("usage")) if doc.get("status", "completed") != "in_progress" else None
    return anthropic_usage(doc.get("usage"))


class SseMeter:
    """Incremental usage meter over a server-sent-events stream, fed raw bytes chunk by chunk.

    Cheap on the hot path: only events that can carry usage are JSON-decoded; the rest are skipped
    by a substring test. ``result()`` is the usage once the stream reported it completely.
    """

    _ANTHROPIC_KEYS = (b"message_start", b"message_delta", b"message_stop")
    _OPENAI_KEYS = (b"response.completed", b"response.incomplete", b"response.failed")

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._buf = bytearray()
        self._scan = 0  # where to resume looking for an event boundary
        self._keys = self._OPENAI_KEYS if dialect is Dialect.OPENAI else self._ANTHROPIC_KEYS
        self._start: dict[str, Any] | None = None  # Anthropic message_start usage
        self._delta: dict[str, Any] = {}  # Anthropic message_delta usage (cumulative, latest wins)
        self._saw_delta = False
        self._final: Usage | None = None
        self.broken = False  # an event we could not parse (the meter then reports None)

    def feed(self, chunk: bytes) -> None:
        if self.broken or not chunk:
            return
        self._buf += chunk
        while True:
            end, sep = self._boundary()
            if end < 0:
                if len(self._buf) > MAX_EVENT_BYTES:
                    self.broken = True
                    self._buf.clear()
                return
            event = bytes(self._buf[:end])
            del self._buf[: end + sep]
            self._scan = 0
            if any(k in event for k in self._keys):
                self._event(event)

    def _boundary(self) -> tuple[int, int]:
        start = max(0, self._scan - 3)
        best, size = -1, 0
        for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
            i = self._buf.find(sep, start)
            if i >= 0 and (best < 0 or i < best):
                best, size = i, len(sep)
        if best < 0:
            self._scan = len(self._buf)
        return best, size

    def _event(self, raw: bytes) -> None:
        lines = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        data = b"\n".join(line[5:].lstrip(b" ") if line.startswith(b"data:") else b"" for line in lines)
        data = data.strip()
        if not data:
            return
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            self.broken = True
            return
        if not isinstance(doc, dict):
            return
        kind = doc.get("type")
        if self.dialect is Dialect.OPENAI:
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                response = doc.get("response")
                usage = openai_usage(response.get("usage")) if isinstance(response, dict) else None
                if usage is not None:
                    self._final = usage
            return
        if kind == "message_start":
            message = doc.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._start = usage
        elif kind == "message_delta":
            usage = doc.get("usage")
            if isinstance(usage, dict):
                self._delta.update({k: v for k, v in usage.items() if v is not None})
                self._saw_delta = True

    def result(self) -> Usage | None:
        """The metered usage, or ``None`` when the stream did not (yet) report it completely."""
        if self.broken:
            return None
        if self.dialect is Dialect.OPENAI:
            return self._final
        if self._start is None or not self._saw_delta:
            return None
        return anthropic_usage({**self._start, **self._delta})


class BodyMeter:
    """The same interface for a non-streaming JSON response: accumulate, parse at the end."""

    def __init__(self, dialect: Dialect, limit: int = 64 * 1024 * 1024) -> None:
        self.dialect = dialect
        self._buf = bytearray()
        self._limit = limit
        self.broken = False

    def feed(self, chunk: bytes) -> None:
        if self.broken:
            return
        self._buf += chunk
        if len(self._buf) > self._limit:
            self.broken = True
            self._buf.clear()

    def result(self) -> Usage | None:
        return None if self.broken else parse_response_usage(self.dialect, bytes(self._buf))


# ---- reservations --------------------------------------------------------------------------------


def declared_max_output(dialect: Dialect, body: dict[str, Any]) -> int:
    """The response size the request allows (its own cap, else the default), capped at 1M tokens."""
    raw = body.get("max_output_tokens" if dialect is Dialect.OPENAI else "max_tokens")
    value = _count(raw)
    return min(value if value is not None else DEFAULT_MAX_OUTPUT, MAX_OUTPUT_CAP)


def reserved_tokens(dialect: Dialect, body: dict[str, Any], body_bytes: int) -> int:
    """Upper bound on what one request can spend: body bytes (1 byte >= 1 token) + declared max output."""
    return body_bytes + declared_max_output(dialect, body)


@dataclass(frozen=True)
class Spend:
    """A run's spend picture at admission time (under its row lock)."""

    used_tokens: int
    used_cost: Decimal | None  # None: nothing priced recorded yet
    live: int  # active reservations
    live_tokens: int
    live_cost: Decimal


@dataclass(frozen=True)
class Admission:
    admitted: bool
    code: str | None = None  # llm_reservation_ceiling_exceeded | llm_budget_reservation_exceeded
    message: str | None = None


def exhausted(spend: Spend, max_tokens: int | None, max_cost: float | None) -> str | None:
    """The pre-check on recorded usage: which budget is already spent (cost first), if any."""
    if max_cost is not None and spend.used_cost is not None and spend.used_cost >= Decimal(str(max_cost)):
        return "max_cost_usd"
    if max_tokens is not None and spend.used_tokens >= max_tokens:
        return "max_tokens"
    return None


def admit(
    spend: Spend,
    tokens: int,
    cost: Decimal | None,
    *,
    max_tokens: int | None,
    max_cost: float | None,
    ceiling: int,
) -> Admission:
    """Admit a reservation iff under the in-flight ceiling and, unless it is the lone request in
    flight, it fits what is left of each budget together with everything already reserved."""
    if spend.live >= ceiling:
        return Admission(
            False,
            "llm_reservation_ceiling_exceeded",
            f"{spend.live} model requests are already in flight for this session (ceiling {ceiling})",
        )
    if spend.live == 0:
        return Admission(True)  # the lone-request carve-out: overspend is bounded by one request
    if max_tokens is not None and spend.used_tokens + spend.live_tokens + tokens > max_tokens:
        return Admission(
            False,
            "llm_budget_reservation_exceeded",
            f"token budget: {spend.used_tokens} used + {spend.live_tokens} reserved + {tokens} requested "
            f"exceeds {max_tokens}",
        )
    if max_cost is not None and cost is not None:
        used = spend.used_cost or Decimal(0)
        if used + spend.live_cost + cost > Decimal(str(max_cost)):
            return Admission(
                False,
                "llm_budget_reservation_exceeded",
                f"cost budget: ${used:.6f} used + ${spend.live_cost:.6f} reserved + ${cost:.6f} requested "
                f"exceeds ${max_cost}",
            )
    return Admission(True)
