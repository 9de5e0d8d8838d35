"""core.authority: whose authority an approved call executes under, from the frozen binding alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from core.authority import Authority, classify
from core.errors import Conflict


def row(tool: str, **binding: Any) -> SimpleNamespace:
    base: dict[str, Any] = {
        "tool": tool,
        "spec_owner_type": None,
        "spec_owner_user_id": None,
        "binding_owner_type": None,
        "binding_owner_user_id": None,
        "binding_connection_id": None,
        "connection_found": True,
        "connection_display_name": None,
    }
    return SimpleNamespace(**{**base, **binding})


def test_non_mcp_tools_are_credentialless() -> None:
    assert classify(row("Bash")) == Authority("credentialless")


def test_a_sandbox_class_mcp_tool_is_organization_authority() -> None:
    assert classify(row("mcp__files__read")).public == "organization"


def test_a_brokered_call_on_an_org_connection_is_organization_authority() -> None:
    r = row("mcp__calc__add", spec_owner_type="organization", binding_owner_type="organization")
    assert classify(r) == Authority("organization")


def test_a_brokered_call_on_a_personal_connection_belongs_to_its_owner() -> None:
    r = row(
        "mcp__calc__add",
        spec_owner_type="user",
        binding_owner_type="user",
        binding_owner_user_id="u-1",
        binding_connection_id="c-1",
        connection_display_name="Alice's calc",
    )
    got = classify(r)
    assert (got.kind, got.owner_user_id, got.connection, got.public) == ("personal", "u-1", "Alice's calc", "personal")


def test_either_side_saying_user_makes_it_personal() -> None:
    # The frozen spec and the binding row disagree: never downgrade a personal call to an org one.
    r = row("mcp__calc__add", spec_owner_type="user", spec_owner_user_id="u-2", binding_owner_type="organization")
    assert classify(r).kind == "personal" and classify(r).owner_user_id == "u-2"


@pytest.mark.parametrize(
    "binding",
    [
        {"spec_owner_type": "user"},  # a brokered surface without its binding row
        {"spec_owner_type": "user", "binding_owner_type": "user", "connection_found": False},
        {"spec_owner_type": "user", "binding_owner_type": "user"},  # personal, but no owner recorded
    ],
)
def test_inconsistent_bindings_are_refused_rather_than_guessed(binding: dict[str, Any]) -> None:
    with pytest.raises(Conflict):
        classify(row("mcp__calc__add", **binding))
