"""The gate's frozen-schema step: mcp__ arguments are checked against the snapshot the run froze."""

from __future__ import annotations

from typing import Any

from core.gate import decide
from core.policy import DEFAULT_BUDGETS
from core.runspec import RunSpec, WorkspaceSpec

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 10}, "priority": {"type": "integer"}},
    "required": ["title"],
    "additionalProperties": False,
}


def spec_with(schema: Any) -> RunSpec:
    return RunSpec(
        run_id="r", tenant_id="t", agent_id="a", agent_revision_id="v", agent_name="n", harness="replay",
        model="replay", task="t", workspace=WorkspaceSpec(), autonomy="supervised", budgets=DEFAULT_BUDGETS,
        policy_id="p", policy_name="p", policy_version=1,
        policy_snapshot={"name": "p", "defaults": {"tool_action": "allow"}},
        brokered=[{"slot": "tracker", "tools": [{"name": "create_issue", "input_schema": schema}]}],
    )  # fmt: skip


def test_arguments_matching_the_frozen_schema_reach_the_policy() -> None:
    d = decide(spec_with(SCHEMA), "mcp__tracker__create_issue", {"title": "bug"}, registered_calls=1)
    assert (d.verdict, d.source) == ("allow", "policy")


def test_arguments_breaking_the_frozen_schema_are_denied_with_their_pointers() -> None:
    d = decide(
        spec_with(SCHEMA), "mcp__tracker__create_issue", {"title": "x" * 11, "priority": "high", "x": 1},
        registered_calls=1,
    )  # fmt: skip
    assert (d.verdict, d.source) == ("deny", "schema")
    assert d.reason == "arguments rejected by frozen schema: /, /priority, /title"


def test_a_missing_required_field_is_reported_at_the_root() -> None:
    d = decide(spec_with(SCHEMA), "mcp__tracker__create_issue", {}, registered_calls=1)
    assert d.reason == "arguments rejected by frozen schema: /"


def test_an_unusable_frozen_schema_fails_closed() -> None:
    for schema in ({"type": "nonsense"}, {"$ref": "https://evil.example/schema.json"}, ["not", "a", "dict"]):
        d = decide(spec_with(schema), "mcp__tracker__create_issue", {"title": "a"}, registered_calls=1)
        assert (d.verdict, d.source, d.reason) == ("deny", "schema", "frozen schema invalid — refresh the snapshot")


def test_a_tool_without_a_schema_skips_the_step_and_an_unfrozen_tool_never_reaches_it() -> None:
    assert decide(spec_with(None), "mcp__tracker__create_issue", {"any": 1}, registered_calls=1).verdict == "allow"
    d = decide(spec_with(SCHEMA), "mcp__tracker__delete_everything", {}, registered_calls=1)
    assert (d.verdict, d.source) == ("deny", "capability")


def test_each_schema_is_judged_on_its_own_after_another_was_checked() -> None:
    counted = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
    tool = "mcp__tracker__create_issue"
    # In turns, so each check follows one against the other schema (and its compiled validator).
    for _ in range(2):
        assert decide(spec_with(SCHEMA), tool, {"title": "bug"}, registered_calls=1).verdict == "allow"
        d = decide(spec_with(counted), tool, {"title": "bug"}, registered_calls=1)
        assert (d.verdict, d.reason) == ("deny", "arguments rejected by frozen schema: /")
        assert decide(spec_with(counted), tool, {"count": 3}, registered_calls=1).verdict == "allow"
        d = decide(spec_with(SCHEMA), tool, {"count": 3}, registered_calls=1)
        assert (d.verdict, d.reason) == ("deny", "arguments rejected by frozen schema: /")
        d = decide(spec_with(counted), tool, {"count": "three"}, registered_calls=1)
        assert (d.verdict, d.reason) == ("deny", "arguments rejected by frozen schema: /count")
    # An equal schema built anew (another run's snapshot, keys in another order) is judged the same way.
    reordered = {"required": ["count"], "properties": {"count": {"type": "integer"}}, "type": "object"}
    assert decide(spec_with(reordered), tool, {"count": "x"}, registered_calls=1).verdict == "deny"
    assert decide(spec_with(SCHEMA), tool, {"title": "y"}, registered_calls=1).verdict == "allow"
