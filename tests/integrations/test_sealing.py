"""Credential sealing: round trips, context binding, tamper evidence, rotation, key hygiene."""

from __future__ import annotations

import base64
import secrets

import pytest

from integrations.sealing import (
    FORMAT_VERSION,
    Sealer,
    SealingError,
    SealingKeyError,
    generate_key,
    parse_key,
)

CONTEXT = "tenant-a:integration_connections.credential"
SECRET = "ghp_supersecretvalue_0123456789"


def new_sealer() -> Sealer:
    return Sealer.from_setting(generate_key())


def test_round_trip_returns_the_plaintext_bytes() -> None:
    sealer = new_sealer()
    assert sealer.open(sealer.seal(SECRET, context=CONTEXT), context=CONTEXT) == SECRET.encode()
    assert sealer.open(sealer.seal(b"\x00\xff raw", context=CONTEXT), context=CONTEXT) == b"\x00\xff raw"
    assert sealer.open(sealer.seal(b"", context=CONTEXT), context=CONTEXT) == b""


def test_blob_layout_is_version_key_id_nonce_ciphertext_tag() -> None:
    sealer = new_sealer()
    blob = sealer.seal(b"abc", context=CONTEXT)
    assert blob[0] == FORMAT_VERSION == 0x01
    assert blob[1:9].hex() == sealer.key_id
    assert len(sealer.key_id) == 16
    assert len(blob) == 1 + 8 + 12 + 3 + 16


def test_key_id_is_a_prefix_of_the_sha256_of_the_key() -> None:
    import hashlib

    key = generate_key()
    assert Sealer.from_setting(key).key_id == hashlib.sha256(bytes.fromhex(key)).hexdigest()[:16]


@pytest.mark.parametrize(
    "other",
    [
        "tenant-b:integration_connections.credential",
        "tenant-a:integration_connections.webhook_secret",
        "tenant-a:integration_connections.credential ",
    ],
)
def test_opening_under_another_context_fails(other: str) -> None:
    sealer = new_sealer()
    blob = sealer.seal(SECRET, context=CONTEXT)
    with pytest.raises(SealingError, match="failed authentication"):
        sealer.open(blob, context=other)


def test_flipping_any_byte_anywhere_fails() -> None:
    sealer = new_sealer()
    blob = sealer.seal(SECRET, context=CONTEXT)
    for index in range(len(blob)):
        for mask in (0x01, 0x80):
            tampered = bytearray(blob)
            tampered[index] ^= mask
            with pytest.raises(SealingError):
                sealer.open(bytes(tampered), context=CONTEXT)


def test_truncated_or_extended_blobs_fail() -> None:
    sealer = new_sealer()
    blob = sealer.seal(SECRET, context=CONTEXT)
    for cut in (0, 1, 9, 21, 36, len(blob) - 1):
        with pytest.raises(SealingError):
            sealer.open(blob[:cut], context=CONTEXT)
    with pytest.raises(SealingError):
        sealer.open(blob + b"\x00", context=CONTEXT)


def test_unknown_format_version_is_refused_before_decryption() -> None:
    sealer = new_sealer()
    blob = bytearray(sealer.seal(SECRET, context=CONTEXT))
    blob[0] = 0x02
    with pytest.raises(SealingError, match="format version"):
        sealer.open(bytes(blob), context=CONTEXT)


def test_a_blob_from_another_key_fails_with_sealing_error_naming_its_key_id() -> None:
    mine, theirs = new_sealer(), new_sealer()
    blob = theirs.seal(SECRET, context=CONTEXT)
    with pytest.raises(SealingError, match="unknown key") as info:
        mine.open(blob, context=CONTEXT)
    assert theirs.key_id in str(info.value)


def test_a_forged_key_id_does_not_open_under_the_real_key() -> None:
    mine, theirs = new_sealer(), new_sealer()
    forged = bytearray(theirs.seal(SECRET, context=CONTEXT))
    forged[1:9] = bytes.fromhex(mine.key_id)
    with pytest.raises(SealingError, match="failed authentication"):
        mine.open(bytes(forged), context=CONTEXT)


def test_rotation_opens_old_blobs_and_seals_with_the_new_key() -> None:
    old_key, new_key = generate_key(), generate_key()
    old = Sealer.from_setting(old_key)
    old_blob = old.seal(SECRET, context=CONTEXT)

    rotated = Sealer.from_setting(new_key, previous=[old_key])
    assert rotated.key_id != old.key_id
    assert rotated.key_ids == (rotated.key_id, old.key_id)
    assert rotated.open(old_blob, context=CONTEXT) == SECRET.encode()
    assert rotated.needs_reseal(old_blob)

    new_blob = rotated.seal(SECRET, context=CONTEXT)
    assert new_blob[1:9].hex() == rotated.key_id
    assert not rotated.needs_reseal(new_blob)
    # Once the old key is dropped from the setting, a fresh blob still opens and an old one no longer does.
    only_new = Sealer.from_setting(new_key)
    assert only_new.open(new_blob, context=CONTEXT) == SECRET.encode()
    with pytest.raises(SealingError, match="unknown key"):
        only_new.open(old_blob, context=CONTEXT)


def test_previous_keys_accept_a_comma_separated_setting_and_ignore_the_current_key() -> None:
    current, old1, old2 = generate_key(), generate_key(), generate_key()
    sealer = Sealer.from_setting(current, previous=f"{old1}, {current},{old2}")
    assert len(sealer.key_ids) == 3
    for key in (old1, old2):
        assert sealer.open(Sealer.from_setting(key).seal(b"x", context=CONTEXT), context=CONTEXT) == b"x"


def test_the_blob_never_contains_the_plaintext() -> None:
    sealer = new_sealer()
    plaintext = b"A" * 64 + SECRET.encode()
    blob = sealer.seal(plaintext, context=CONTEXT)
    assert SECRET.encode() not in blob
    assert b"AAAAAAAA" not in blob
    assert CONTEXT.encode() not in blob


def test_two_seals_of_the_same_plaintext_differ() -> None:
    sealer = new_sealer()
    first, second = sealer.seal(SECRET, context=CONTEXT), sealer.seal(SECRET, context=CONTEXT)
    assert first != second
    assert first[9:21] != second[9:21]


def test_an_empty_context_is_refused() -> None:
    sealer = new_sealer()
    with pytest.raises(SealingError, match="context"):
        sealer.seal(SECRET, context="")
    with pytest.raises(SealingError, match="context"):
        sealer.open(sealer.seal(SECRET, context=CONTEXT), context="")


def test_memoryview_blobs_from_database_drivers_open() -> None:
    sealer = new_sealer()
    blob = sealer.seal(SECRET, context=CONTEXT)
    assert sealer.open(memoryview(blob), context=CONTEXT) == SECRET.encode()  # type: ignore[arg-type]


def test_errors_never_carry_plaintext_or_key_material() -> None:
    key = generate_key()
    sealer = Sealer.from_setting(key)
    blob = sealer.seal(SECRET, context=CONTEXT)
    with pytest.raises(SealingError) as info:
        sealer.open(blob, context="tenant-b:x")
    text = str(info.value) + repr(info.value) + repr(sealer)
    assert SECRET not in text
    assert key not in text
    assert info.value.__cause__ is None


@pytest.mark.parametrize(
    "spelling",
    [
        lambda raw: raw.hex(),
        lambda raw: raw.hex().upper(),
        lambda raw: base64.b64encode(raw).decode(),
        lambda raw: base64.b64encode(raw).decode().rstrip("="),
        lambda raw: base64.urlsafe_b64encode(raw).decode(),
        lambda raw: f"  {raw.hex()}\n",
    ],
    ids=["hex", "HEX", "base64", "base64-unpadded", "urlsafe-base64", "surrounding-whitespace"],
)
def test_accepted_key_spellings_all_decode_to_the_same_key(spelling: object) -> None:
    raw = secrets.token_bytes(32)
    assert callable(spelling)
    assert parse_key(spelling(raw)) == raw
    assert Sealer.from_setting(spelling(raw)).key_id == Sealer(raw).key_id


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("changeme", "placeholder"),
        ("change-me-to-a-real-key", "placeholder"),
        ("00" * 32, "all zeros"),
        ("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "all zeros"),
        ("ab" * 32, "distinct bytes"),
        ("0123456789abcdef" * 4, "repeated pattern"),
        (base64.b64encode(b"correct horse battery staple!!!!").decode(), "passphrase"),
        ("ab" * 31, "not a valid key"),
        ("ab" * 33, "not a valid key"),
        ("zz" * 32, "not a valid key"),
        # Fixed bytes of the wrong lengths (random ones would give each pytest-xdist worker other test ids).
        (base64.b64encode(bytes(range(7, 23))).decode(), "not a valid key"),
        (base64.b64encode(bytes(range(9, 57))).decode(), "not a valid key"),
    ],
)
def test_bad_keys_are_rejected_with_a_helpful_message(value: str, why: str) -> None:
    with pytest.raises(SealingKeyError) as info:
        Sealer.from_setting(value)
    message = str(info.value)
    assert why in message
    assert "FLUIDBOX_CREDENTIAL_KEY" in message
    assert "64 hex characters" in message and "base64" in message
    if len(value.strip()) >= 16:
        assert value.strip() not in message


def test_a_bad_previous_key_is_named_as_such() -> None:
    with pytest.raises(SealingKeyError, match="previous FLUIDBOX_CREDENTIAL_KEY #2"):
        Sealer.from_setting(generate_key(), previous=[generate_key(), "changeme"])


def test_raw_keys_of_the_wrong_length_are_rejected() -> None:
    with pytest.raises(SealingKeyError, match="32 bytes"):
        Sealer(secrets.token_bytes(16))


def test_sealing_key_error_is_a_sealing_error() -> None:
    assert issubclass(SealingKeyError, SealingError)


def test_generate_key_is_fresh_hex_that_from_setting_accepts() -> None:
    first, second = generate_key(), generate_key()
    assert first != second
    assert len(first) == 64 and int(first, 16) >= 0
    assert Sealer.from_setting(first).key_id != Sealer.from_setting(second).key_id
