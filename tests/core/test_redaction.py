"""The redactor: token shapes from spec/domain.md section 3 are scrubbed at any depth."""

from __future__ import annotations

from typing import Any

import pytest

from core.redaction import MARK, Redacted, Redactor, scrub_text

# (shape, secret text, the part that must not survive)
SECRETS: list[tuple[str, str, str]] = [
    ("anthropic", "sk-ant-api03-AbCdEf012345_-xyz", "AbCdEf012345"),
    ("openai-project", "sk-proj-AbCdEf0123456789", "AbCdEf0123456789"),
    ("openai", "sk-AbCdEfGh0123456789wxyz", "AbCdEfGh0123456789"),
    ("fluidbox-session", "fbx_sess_0123456789abcdef0123456789abcdef", "0123456789abcdef"),
    ("fluidbox-trigger", "fbx_trig_AbCdEf0123456789", "AbCdEf0123456789"),
    ("fluidbox-web", "fbx_web_AbCdEf0123456789", "AbCdEf0123456789"),
    ("fluidbox-pat", "fbx_pat_AbCdEf0123456789", "AbCdEf0123456789"),
    ("github-classic", "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1", "A1b2C3d4E5f6G7h8I9j0"),
    ("github-oauth", "gho_" + "A1b2C3d4E5f6G7h8I9j0K1", "A1b2C3d4E5f6G7h8I9j0"),
    ("github-fine-grained", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "11ABCDEFG0123456789"),
    ("aws", "AKIAIOSFODNN7EXAMPLE", "IOSFODNN7EXAMPLE"),
    ("slack", "xoxb-1234567890-abcdefghij", "1234567890-abcdefghij"),
    ("neon", "npg_AbCdEf012345", "AbCdEf012345"),
    ("bearer", "Bearer abcdefghijklmnop0123", "abcdefghijklmnop0123"),
    ("bearer-lowercase", "bearer abcdefghijklmnop0123", "abcdefghijklmnop0123"),
    ("postgres-password", "postgres://user:pw@db.internal:5432/app", "user:pw"),
]
IDS = [s[0] for s in SECRETS]


@pytest.mark.parametrize(("shape", "secret", "core"), SECRETS, ids=IDS)
def test_each_token_shape_is_replaced_by_the_redaction_mark(shape: str, secret: str, core: str) -> None:
    out = scrub_text(f"before {secret} after")
    assert core not in out
    assert MARK in out
    assert out.startswith("before ") and out.endswith(" after")


@pytest.mark.parametrize(("shape", "secret", "core"), SECRETS, ids=IDS)
def test_each_token_shape_is_scrubbed_at_any_depth_of_a_json_value(shape: str, secret: str, core: str) -> None:
    value = {
        "top": secret,
        "list": ["ok", secret, {"deep": [f"x={secret}", {"deeper": secret}]}],
        "n": 3,
    }
    out = Redactor().redact(value).value
    flat = repr(out)
    assert core not in flat
    assert out["n"] == 3
    assert out["list"][0] == "ok"
    assert MARK in out["top"]
    assert MARK in out["list"][1]
    assert MARK in out["list"][2]["deep"][0]
    assert MARK in out["list"][2]["deep"][1]["deeper"]


def test_a_postgres_url_keeps_its_host_but_loses_its_credentials() -> None:
    out = scrub_text("DATABASE_URL=postgres://fluid:s3cret-pw@db:5432/app")
    assert out == f"DATABASE_URL=postgres://{MARK}@db:5432/app"


def test_an_authorization_header_loses_its_bearer_token() -> None:
    out = Redactor().redact({"headers": {"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig"}}).value
    assert out == {"headers": {"Authorization": MARK}}


def test_several_secrets_in_one_string_are_all_scrubbed() -> None:
    text = "a=sk-ant-AAAAAAAAAAAA b=ghp_BBBBBBBBBBBBBBBBBBBBBBBB c=AKIACCCCCCCCCCCCCCCC"
    assert scrub_text(text) == f"a={MARK} b={MARK} c={MARK}"


def test_tuples_are_scrubbed_like_lists() -> None:
    out = Redactor().redact({"t": ("fine", "npg_AbCdEf012345")}).value
    assert out == {"t": ["fine", MARK]}


def test_extra_secrets_given_to_the_redactor_are_scrubbed_everywhere() -> None:
    admin = "correct-horse-battery-staple"
    redactor = Redactor(extra_secrets=(admin, "upstream-key-123456"))
    out = redactor.redact({"msg": f"token is {admin}!", "nested": [{"k": "upstream-key-123456"}]}).value
    assert out == {"msg": f"token is {MARK}!", "nested": [{"k": MARK}]}


def test_extra_secrets_shorter_than_eight_characters_are_ignored() -> None:
    out = Redactor(extra_secrets=("a", "short")).redact("a short sentence").value
    assert out == "a short sentence"


def test_an_extra_secret_is_not_scrubbed_by_a_redactor_that_was_not_told_about_it() -> None:
    assert Redactor().redact("correct-horse-battery-staple").value == "correct-horse-battery-staple"


NON_SECRETS: list[Any] = [
    "hello world",
    "the task is to fix bug #12 in sk-learn",
    "sk-short",
    "ghp_short",
    "npg_short",
    "xoxb-short",
    "Bearer short",
    "AKIA-not-a-key",
    "https://example.com/path?q=1",
    "postgres://db.internal:5432/app",
    "user@example.com",
    "fbx_sess_",
    "risk-antelope-api",
    "",
    "‹already› unicode ✓",
]


@pytest.mark.parametrize("text", NON_SECRETS)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert scrub_text(text) == text
    assert Redactor().redact(text).value == text


def test_non_string_json_values_are_unchanged() -> None:
    value = {"i": 1, "f": 2.5, "b": True, "z": None, "l": [1, None, False], "d": {}}
    assert Redactor().redact(value).value == value


def test_redact_does_not_mutate_its_input() -> None:
    value = {"a": ["npg_AbCdEf012345"]}
    Redactor().redact(value)
    assert value == {"a": ["npg_AbCdEf012345"]}


def test_redact_returns_a_redacted_wrapper() -> None:
    assert isinstance(Redactor().redact({"x": 1}), Redacted)


def test_redacted_cannot_be_constructed_directly() -> None:
    with pytest.raises(TypeError):
        Redacted({"x": 1}, object())
    with pytest.raises(TypeError):
        Redacted({"x": 1})  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Redacted({"x": 1}, None)


def test_a_secret_used_as_a_dict_key_is_scrubbed_too() -> None:
    secret = "ghp_" + "a" * 30
    out = Redactor().redact({"files": {secret: 1}}).value
    assert secret not in repr(out)
