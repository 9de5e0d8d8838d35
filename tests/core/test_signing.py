"""Webhook signatures: the spec's test vector, tampering, and the timestamp tolerance."""

from __future__ import annotations

import pytest

from core.signing import SignatureError, sign, verify

SECRET = "fbx_whsec_test"
TS = 1752000000
BODY = '{"a":1}'
VECTOR = "v1=b519ceca5a07a724c2e3aef9decbc4420a5cd7f303bfdf1a28a8c2b63625aa72"


def test_the_spec_test_vector_signs_exactly() -> None:
    assert sign(SECRET, TS, BODY) == VECTOR
    assert sign(SECRET, TS, BODY.encode()) == VECTOR


def test_a_genuine_request_verifies() -> None:
    verify(SECRET, str(TS), BODY.encode(), VECTOR, now=TS + 10)


@pytest.mark.parametrize(
    ("secret", "timestamp", "body"),
    [
        ("fbx_whsec_other", str(TS), BODY),  # wrong secret
        (SECRET, str(TS + 1), BODY),  # timestamp moved
        (SECRET, str(TS), '{"a":2}'),  # body changed
        (SECRET, str(TS), '{"a": 1}'),  # same JSON, different bytes
    ],
)
def test_any_tampering_fails_verification(secret: str, timestamp: str, body: str) -> None:
    with pytest.raises(SignatureError, match="does not match"):
        verify(secret, timestamp, body, VECTOR, now=TS)


def test_a_flipped_signature_digit_fails() -> None:
    flipped = VECTOR[:-1] + ("3" if VECTOR[-1] != "3" else "4")
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, str(TS), BODY, flipped, now=TS)


def test_the_timestamp_tolerance_applies_both_ways() -> None:
    verify(SECRET, str(TS), BODY, VECTOR, now=TS + 300, tolerance_secs=300)
    verify(SECRET, str(TS), BODY, VECTOR, now=TS - 300, tolerance_secs=300)
    with pytest.raises(SignatureError, match="tolerance"):
        verify(SECRET, str(TS), BODY, VECTOR, now=TS + 301, tolerance_secs=300)
    with pytest.raises(SignatureError, match="tolerance"):
        verify(SECRET, str(TS), BODY, VECTOR, now=TS - 301, tolerance_secs=300)


def test_malformed_headers_are_named() -> None:
    with pytest.raises(SignatureError, match="unix time"):
        verify(SECRET, "yesterday", BODY, VECTOR, now=TS)
    with pytest.raises(SignatureError, match="no v1= entry"):
        verify(SECRET, str(TS), BODY, VECTOR.replace("v1=", "v0="), now=TS)


def test_one_matching_entry_in_a_list_is_enough() -> None:
    other = sign("fbx_whsec_rotated", TS, BODY)
    verify(SECRET, str(TS), BODY, f"{other}, {VECTOR}", now=TS)


def test_an_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="secret"):
        sign("", TS, BODY)
