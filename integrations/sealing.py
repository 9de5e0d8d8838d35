"""Credential custody: seal secrets at rest with AES-256-GCM under a deployment key.

Every upstream credential we store (MCP tokens, webhook secrets, client secrets) goes
through :class:`Sealer` before it reaches PostgreSQL, so a database dump alone never
yields a usable secret (security invariant 2).

Blob format (version 0x01)::

    0x01 || key_id (8 bytes) || nonce (12 bytes) || ciphertext || tag (16 bytes)

- ``key_id`` is the first 8 bytes of SHA-256 of the key. It lets :meth:`Sealer.open`
  pick the right key during a rotation without trial decryption, and lets a re-seal
  job find rows still sealed under an old key (:meth:`Sealer.needs_reseal`).
- The associated data is ``header || b"fbx:v1:" || context``. Binding the header means
  flipping the version or key id fails authentication; binding the caller's context
  (``"<tenant_id>:<table>.<column>"``) means a blob copied into another tenant's row or
  another column fails to open instead of silently decrypting there.
- The nonce is random. AES-GCM with random 96-bit nonces stays within its safety
  margin for about 2**32 seals per key, far beyond the number of credentials one
  deployment stores; rotate the key long before that.

The spec's per-tenant envelope format (domain §13, DEKs wrapped by a KEK) can arrive
as format version 0x02 next to this one; the leading version byte exists so that it
can, while the companion ``_key_version`` column stays the authority on which format
a column holds.

Errors::

    SealingError          a blob cannot be sealed or opened (no plaintext or key in the message)
    └── SealingKeyError   FLUIDBOX_CREDENTIAL_KEY (or a previous key) is unusable
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "FORMAT_VERSION",
    "KEY_SETTING",
    "Sealer",
    "SealingError",
    "SealingKeyError",
    "generate_key",
    "parse_key",
]

KEY_SETTING = "FLUIDBOX_CREDENTIAL_KEY"
FORMAT_VERSION = 0x01

_KEY_LEN = 32
_KEY_ID_LEN = 8
_NONCE_LEN = 12
_TAG_LEN = 16
_HEADER_LEN = 1 + _KEY_ID_LEN
_MIN_BLOB_LEN = _HEADER_LEN + _NONCE_LEN + _TAG_LEN
_AAD_PREFIX = b"fbx:v1:"

_ACCEPTED_FORMATS = (
    "64 hex characters or base64 (standard or URL-safe) of 32 random bytes; "
    "generate one with `python -c 'import secrets; print(secrets.token_hex(32))'`"
)
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_B64_KEY = re.compile(r"[A-Za-z0-9+/_-]{43}=?")
_PLACEHOLDER_WORDS = ("change", "replace", "example", "placeholder", "secret", "your", "todo", "xxx", "dummy", "test")


class SealingError(Exception):
    """A blob could not be sealed or opened. Messages never carry plaintext or key bytes."""


class SealingKeyError(SealingError):
    """The configured key is missing, malformed or obviously not random."""


def sealer_from_settings(key: str | None, previous: Sequence[str] = ()) -> Sealer | None:
    """The process's sealer, or None when no key is configured (credential routes then answer 503)."""
    if not key:
        return None
    return Sealer.from_setting(key, previous=list(previous))


def generate_key() -> str:
    """A fresh random key in the hex form :meth:`Sealer.from_setting` accepts."""
    return secrets.token_hex(_KEY_LEN)


def parse_key(value: str, *, setting: str = KEY_SETTING) -> bytes:
    """Decode a key setting (hex or base64 of 32 bytes) and refuse weak or placeholder keys.

    ``setting`` only names the source in error messages; the value itself is never echoed.
    """
    if not isinstance(value, str):
        raise SealingKeyError(f"{setting} must be a string: {_ACCEPTED_FORMATS}")
    text = value.strip()
    if not text:
        raise SealingKeyError(f"{setting} is empty: set it to {_ACCEPTED_FORMATS}")
    key = _decode(text)
    if key is None:
        hint = " (it looks like a placeholder)" if _looks_like_placeholder(text) else ""
        raise SealingKeyError(f"{setting} is not a valid key{hint}: expected {_ACCEPTED_FORMATS}")
    weakness = _weakness(key)
    if weakness is not None:
        raise SealingKeyError(f"{setting} is not a usable key ({weakness}): expected {_ACCEPTED_FORMATS}")
    return key


def _decode(text: str) -> bytes | None:
    if _HEX_KEY.fullmatch(text):
        return bytes.fromhex(text)
    if not _B64_KEY.fullmatch(text):
        return None
    standard = text.replace("-", "+").replace("_", "/").rstrip("=") + "="
    try:
        key = base64.b64decode(standard, validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(key) == _KEY_LEN else None


def _looks_like_placeholder(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _PLACEHOLDER_WORDS) or len(set(lowered)) <= 2


def _weakness(key: bytes) -> str | None:
    # A random 32-byte key trips any of these with probability below 2**-45, so each
    # one means a human typed or derived the key rather than generating it.
    if not any(key):
        return "it is all zeros"
    if len(set(key)) < 8:
        return "it repeats too few distinct bytes to be random"
    if any(key == key[:period] * (_KEY_LEN // period) for period in (1, 2, 4, 8, 16)):
        return "it is a repeated pattern"
    if all(0x20 <= byte < 0x7F for byte in key):
        return "it is printable text, i.e. a passphrase, not random bytes"
    return None


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:_KEY_ID_LEN]


def _aad(header: bytes, context: str) -> bytes:
    if not isinstance(context, str) or not context:
        raise SealingError("a sealing context (e.g. '<tenant_id>:<table>.<column>') is required")
    return header + _AAD_PREFIX + context.encode("utf-8")


class Sealer:
    """Seals with the current key; opens with the current key or any previous one.

    Build it once in the composition root (``Sealer.from_setting(settings...)``) and
    inject it; it holds no state beyond the keys and is safe to share across tasks.
    """

    __slots__ = ("_current", "_current_id", "_keys")

    def __init__(self, key: bytes, *, previous: Sequence[bytes] = ()) -> None:
        """Build from raw 32-byte keys (already decoded); prefer :meth:`from_setting`."""
        self._current_id = _key_id(_check_raw(key, KEY_SETTING))
        self._current = AESGCM(key)
        self._keys: dict[bytes, AESGCM] = {self._current_id: self._current}
        for index, old in enumerate(previous, start=1):
            raw = _check_raw(old, f"previous {KEY_SETTING} #{index}")
            kid = _key_id(raw)
            # Listing the current key among the previous ones is harmless; keep one entry.
            self._keys.setdefault(kid, AESGCM(raw))

    @classmethod
    def from_setting(cls, value: str, *, previous: str | Sequence[str] = ()) -> Sealer:
        """Build from the ``FLUIDBOX_CREDENTIAL_KEY`` text and optional previous keys.

        Args:
            value: the current key, 64 hex characters or base64 of 32 bytes.
            previous: keys retired by a rotation, still accepted by :meth:`open`; either a
                sequence of key strings or one comma-separated string.

        Raises:
            SealingKeyError: any key is missing, malformed, all-zero or a placeholder.
        """
        if isinstance(previous, str):
            previous = [part for part in previous.split(",") if part.strip()]
        old = [parse_key(item, setting=f"previous {KEY_SETTING} #{i}") for i, item in enumerate(previous, start=1)]
        return cls(parse_key(value), previous=old)

    @property
    def key_id(self) -> str:
        """Hex id (16 characters) of the key new blobs are sealed with."""
        return self._current_id.hex()

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Hex ids of every key :meth:`open` accepts, the current one first."""
        return tuple(kid.hex() for kid in self._keys)

    def seal(self, plaintext: bytes | str, *, context: str) -> bytes:
        """Encrypt ``plaintext`` (str is UTF-8 encoded) bound to ``context``."""
        if isinstance(plaintext, str):
            plaintext = plaintext.encode("utf-8")
        elif not isinstance(plaintext, bytes | bytearray | memoryview):
            raise SealingError("only bytes or str can be sealed")
        header = bytes([FORMAT_VERSION]) + self._current_id
        nonce = secrets.token_bytes(_NONCE_LEN)
        sealed = self._current.encrypt(nonce, bytes(plaintext), _aad(header, context))
        return header + nonce + sealed

    def open(self, blob: bytes, *, context: str) -> bytes:
        """Decrypt a blob sealed by this or a previous key under the same ``context``.

        Raises:
            SealingError: bad format, unknown key id, wrong context or any tampering.
        """
        data = _as_bytes(blob)
        kid = _blob_key_id(data)
        aead = self._keys.get(kid)
        if aead is None:
            raise SealingError(
                f"sealed blob uses an unknown key (key id {kid.hex()}); configure that key as "
                f"{KEY_SETTING} or as a previous key"
            )
        header = data[:_HEADER_LEN]
        nonce = data[_HEADER_LEN : _HEADER_LEN + _NONCE_LEN]
        try:
            return aead.decrypt(nonce, data[_HEADER_LEN + _NONCE_LEN :], _aad(header, context))
        except InvalidTag:
            raise SealingError("sealed blob failed authentication (wrong context, tampered or corrupted)") from None

    def needs_reseal(self, blob: bytes) -> bool:
        """True when ``blob`` is well-formed but sealed under a key other than the current one."""
        return _blob_key_id(_as_bytes(blob)) != self._current_id

    def __repr__(self) -> str:
        return f"Sealer(key_id={self.key_id!r}, previous={len(self._keys) - 1})"


def _check_raw(key: bytes, setting: str) -> bytes:
    if not isinstance(key, bytes) or len(key) != _KEY_LEN:
        raise SealingKeyError(f"{setting} must decode to exactly {_KEY_LEN} bytes: expected {_ACCEPTED_FORMATS}")
    weakness = _weakness(key)
    if weakness is not None:
        raise SealingKeyError(f"{setting} is not a usable key ({weakness}): expected {_ACCEPTED_FORMATS}")
    return key


def _as_bytes(blob: bytes) -> bytes:
    # asyncpg hands back bytes, other drivers memoryview; accept both, refuse anything else.
    if isinstance(blob, bytes):
        return blob
    if isinstance(blob, bytearray | memoryview):
        return bytes(blob)
    raise SealingError("a sealed blob must be bytes")


def _blob_key_id(data: bytes) -> bytes:
    if len(data) < _MIN_BLOB_LEN:
        raise SealingError("sealed blob is malformed (too short)")
    if data[0] != FORMAT_VERSION:
        raise SealingError(f"sealed blob has an unsupported format version (0x{data[0]:02x})")
    return data[1:_HEADER_LEN]
