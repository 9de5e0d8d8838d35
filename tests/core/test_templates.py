"""Task templates: ``{{key}}`` substitution; unclosed or unknown placeholders are a 400 naming them."""

from __future__ import annotations

import pytest

from core.errors import BadRequest
from core.templates import placeholders, render, require_only


def test_placeholders_are_substituted_with_optional_inner_spaces() -> None:
    out = render("Fix {{issue}} in {{ repo }} ({{issue}})", {"issue": "#42", "repo": "acme/app"})
    assert out == "Fix #42 in acme/app (#42)"


def test_text_without_placeholders_and_single_braces_pass_through() -> None:
    assert render("plain { text } and }} stray", {}) == "plain { text } and }} stray"
    assert render("", {}) == ""


def test_values_are_inserted_verbatim_and_never_rescanned() -> None:
    assert render("say {{a}}", {"a": "{{b}}", "b": "boom"}) == "say {{b}}"


def test_a_missing_key_is_a_400_naming_the_key() -> None:
    with pytest.raises(BadRequest) as err:
        render("Deploy {{service}} to {{env}}", {"service": "api"})
    assert err.value.message == "task_template references '{{env}}' but the invocation context has no 'env'"


def test_an_unclosed_placeholder_is_a_400_naming_where() -> None:
    with pytest.raises(BadRequest) as err:
        render("Fix {{issue} please", {"issue": "x"})
    assert err.value.message == "task_template has an unclosed '{{' at character 4"
    with pytest.raises(BadRequest, match="unclosed"):
        placeholders("ok {{a}} then {{")


@pytest.mark.parametrize("bad", ["{{}}", "{{ }}", "{{a b}}", "{{1abc}}", "{{a|upper}}"])
def test_a_malformed_key_is_a_400(bad: str) -> None:
    with pytest.raises(BadRequest, match="is not a valid key"):
        render(f"x {bad} y", {"a": "1", "a b": "2", "1abc": "3"})


def test_placeholders_lists_each_key_once_in_first_use_order() -> None:
    assert placeholders("{{b}} {{a}} {{ b }} {{pr.number}} {{x-y}}") == ["b", "a", "pr.number", "x-y"]


def test_require_only_refuses_keys_the_invocation_shape_cannot_supply() -> None:
    require_only("at {{fire_time}}", {"fire_time"}, "scheduled fires")
    with pytest.raises(BadRequest) as err:
        require_only("for {{customer}} at {{fire_time}}", {"fire_time"}, "scheduled fires")
    assert err.value.message == "task_template references '{{customer}}', but scheduled fires only supply fire_time"
