"""Signed webhooks: ``x-fluidbox-signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>``.

The signature covers the exact body bytes and the timestamp header, so a receiver that recomputes it
over the raw request body knows the payload came from the holder of the callback secret, and the
timestamp tolerance bounds how long a captured request can be replayed. Pure: the caller passes the
clock in.

Errors::

    SignatureError   .reason: why verification failed (never contains the secret)
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["DEFAULT_TOLERANCE_SECS", "SCHEME", "SignatureError", "sign", "verify"]

SCHEME = "v1"
DEFAULT_TOLERANCE_SECS = 300


class SignatureError(Exception):
    """A signed request failed verification."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _digest(secret: str, timestamp: int, body: bytes | str) -> str:
    message = str(timestamp).encode("ascii") + b"." + _as_bytes(body)
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def sign(secret: str, timestamp: int, body: bytes | str) -> str:
    """The ``x-fluidbox-signature`` value for ``body`` sent at ``timestamp`` (unix seconds)."""
    if not secret:
        raise ValueError("a signing secret is required")
    return f"{SCHEME}={_digest(secret, timestamp, body)}"


def verify(
    secret: str,
    timestamp: str,
    body: bytes | str,
    signature: str,
    *,
    now: int,
    tolerance_secs: int = DEFAULT_TOLERANCE_SECS,
) -> None:
    """Check a received request's ``x-fluidbox-timestamp`` and ``x-fluidbox-signature`` headers.

    Args:
        secret: the subscription's callback secret (``fbx_whsec_…``).
        timestamp: the timestamp header exactly as received.
        body: the raw request body (not a re-serialization of the parsed JSON).
        signature: the signature header; a comma-separated list is accepted (any ``v1`` entry may match).
        now: the receiver's current unix time.
        tolerance_secs: how far the timestamp may be from ``now``, either way.

    Raises:
        SignatureError: malformed headers, a stale or future timestamp, or no matching signature.
    """
    text = timestamp.strip()
    if not text.isascii() or not text.isdigit():
        raise SignatureError("the timestamp header is not a unix time in seconds")
    sent = int(text)
    if abs(now - sent) > tolerance_secs:
        raise SignatureError(f"the timestamp is outside the {tolerance_secs} s tolerance")
    candidates = [
        value.strip()
        for scheme, _, value in (part.strip().partition("=") for part in signature.split(","))
        if scheme == SCHEME
    ]
    if not candidates:
        raise SignatureError(f"the signature header has no {SCHEME}= entry")
    expected = _digest(secret, sent, body)
    # Compare every candidate (no early exit on the first mismatch position or entry).
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(expected, candidate.lower())
    if not matched:
        raise SignatureError("the signature does not match the body and timestamp")
