"""Harness and model validation (the single source of truth for names)."""

from __future__ import annotations

import pytest

from core import runspec
from core.errors import Unprocessable
from core.harnesses import (
    ANTHROPIC_MESSAGES,
    HARNESSES,
    OPENAI_RESPONSES,
    RUNNABLE,
    check_harness,
    check_harness_config,
    model_api,
)


@pytest.mark.parametrize(
    ("harness", "model"),
    [("replay", "replay"), ("claude-agent-sdk", "claude-haiku-4-5"), ("codex", "gpt-5.4-mini")],
)
def test_check_harness_defaults_the_model_when_omitted(harness: str, model: str) -> None:
    assert check_harness(harness, None) == model


@pytest.mark.parametrize(
    ("harness", "model"),
    [("claude-agent-sdk", "claude-opus-4-8"), ("claude-agent-sdk", "claude-sonnet-5"), ("codex", "gpt-5.4")],
)
def test_check_harness_returns_a_valid_model_unchanged(harness: str, model: str) -> None:
    assert check_harness(harness, model) == model


@pytest.mark.parametrize("harness", ["claude-code", "Codex", "", "openai"])
def test_an_unknown_harness_is_unprocessable_listing_the_known_ones(harness: str) -> None:
    with pytest.raises(Unprocessable) as info:
        check_harness(harness, None)
    assert info.value.status == 422
    message = info.value.message
    assert f"unknown harness '{harness}'" in message
    for known in ("replay", "claude-agent-sdk", "codex"):
        assert known in message


def test_a_model_of_another_harness_is_unprocessable_naming_the_valid_ones() -> None:
    with pytest.raises(Unprocessable) as info:
        check_harness("codex", "claude-haiku-4-5")
    message = info.value.message
    assert "model 'claude-haiku-4-5' is not valid for harness 'codex'" in message
    for valid in ("gpt-5.4-mini", "gpt-5.4", "gpt-5.6-sol"):
        assert valid in message
    assert "claude-sonnet-5" not in message


def test_a_claude_harness_rejects_a_codex_model() -> None:
    with pytest.raises(Unprocessable, match="claude-haiku-4-5, claude-sonnet-5, claude-opus-4-8"):
        check_harness("claude-agent-sdk", "gpt-5.4")


def test_every_default_model_is_one_of_its_harness_models() -> None:
    for name, harness in HARNESSES.items():
        assert harness["default_model"] in [m["id"] for m in harness["models"]], name


def test_runspec_harness_names_and_default_models_agree_with_the_harness_table() -> None:
    assert set(runspec.HARNESSES) == set(HARNESSES)
    assert runspec.DEFAULT_MODELS == {name: h["default_model"] for name, h in HARNESSES.items()}


def test_runnable_harnesses_are_known_harnesses() -> None:
    assert RUNNABLE <= set(HARNESSES)


def test_each_harness_speaks_its_providers_api_and_replay_speaks_what_it_names() -> None:
    assert model_api("claude-agent-sdk", {}) == ANTHROPIC_MESSAGES
    assert model_api("codex", {}) == OPENAI_RESPONSES
    assert model_api("replay", {}) == ANTHROPIC_MESSAGES
    assert model_api("replay", {"model_api": OPENAI_RESPONSES}) == OPENAI_RESPONSES


@pytest.mark.parametrize("harness", ["claude-agent-sdk", "codex"])
def test_model_api_in_a_model_harness_config_is_refused(harness: str) -> None:
    check_harness_config(harness, {})
    with pytest.raises(Unprocessable, match="replay agents only"):
        check_harness_config(harness, {"model_api": OPENAI_RESPONSES})
    check_harness_config("replay", {"model_api": OPENAI_RESPONSES})
