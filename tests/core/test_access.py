"""Tool access classes: the declaration, classification (write over read), the gate and policy rules."""

from __future__ import annotations

from typing import Any

import pytest

from core.access import (
    LEGACY,
    NONE,
    classify,
    definition,
    definition_diff,
    from_catalog,
    parse_access,
    tool_access,
    with_access,
)
from core.errors import Unprocessable
from core.gate import decide
from core.policy import Budgets, evaluate, parse_policy
from core.policy_views import matrix
from core.runner_env import runner_env
from core.runspec import RunSpec, WorkspaceSpec

ALLOW_MCP: dict[str, Any] = {"name": "allow-mcp", "defaults": {"tool_action": "deny"},
                             "tools": [{"match": ["mcp__*"], "action": "allow"}]}  # fmt: skip
DECL = parse_access(
    {"read": {"tools": ["list_*", "get_*", "create_draft"]}, "write": {"tools": ["create_*"], "approval": "always"}}
)


def spec_with(tools: list[dict[str, Any]], policy: dict[str, Any] = ALLOW_MCP, autonomy: str = "supervised") -> RunSpec:
    return RunSpec(
        run_id="run-1", tenant_id="t", agent_id="a", agent_revision_id="r", agent_name="n", harness="replay",
        model="replay", task="x", workspace=WorkspaceSpec(), autonomy=autonomy,  # type: ignore[arg-type]
        budgets=Budgets(max_tool_calls=100), policy_id="p", policy_name=policy["name"], policy_version=1,
        policy_snapshot=policy, brokered=[{"slot": "lin", "connection_id": "c", "tools": tools}],
    )  # fmt: skip


def frozen(decl: dict[str, Any], *names: str) -> list[dict[str, Any]]:
    return [with_access(decl, {"name": n, "description": "", "input_schema": {"type": "object"}}) for n in names]


def test_shorthands_normalize_and_write_wins_over_read() -> None:
    assert parse_access({"read": True, "write": False}) == {
        "read": {"tools": ["*"]},
        "write": {"tools": [], "approval": "always"},
    }
    assert parse_access({"read": False, "write": {"approval": "policy"}})["write"] == {
        "tools": ["*"],
        "approval": "policy",
    }
    assert parse_access({}) == NONE
    assert classify(DECL, "list_issues") == ("read", None)
    # ``create_draft`` is named by a read pattern, and ``create_*`` (write) also matches: write wins.
    assert classify(DECL, "create_draft") == ("write", "always")
    assert classify(DECL, "delete_issue") == (None, None)
    assert classify(None, "list_issues") == (None, None)


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"read": {"tools": [""]}}, "access.read.tools: a tool pattern cannot be empty"),
        ({"write": {"tools": ["x"], "approval": "sometimes"}}, "access.write.approval"),
        ({"write": True}, "`write: true` is ambiguous"),
        ({"reads": True}, "unknown key 'access.reads'"),
        ({"read": {"tools": "x"}}, "access.read.tools"),
    ],
)
def test_a_bad_declaration_is_a_422_naming_the_problem(document: dict[str, Any], named: str) -> None:
    with pytest.raises(Unprocessable) as caught:
        parse_access(document)
    assert named in caught.value.message


def test_a_catalog_connection_starts_with_the_entry_reads_and_no_writes() -> None:
    assert from_catalog(None) == {"read": {"tools": ["*"]}, "write": {"tools": [], "approval": "always"}}
    reviewed = {"read": {"tools": ["list_*"]}, "write": {"tools": ["create_*"], "approval": "policy"}}
    started = from_catalog(reviewed)
    assert started["read"] == {"tools": ["list_*"]} and started["write"]["tools"] == []
    assert classify(started, "create_issue") == (None, None)


def test_the_gate_denies_an_unclassified_tool_naming_the_missing_class() -> None:
    spec = spec_with(frozen(DECL, "list_issues", "delete_issue"))
    denied = decide(spec, "mcp__lin__delete_issue", {}, registered_calls=1)
    assert (denied.verdict, denied.source) == ("deny", "access")
    assert denied.reason == "tool 'delete_issue' has no access class (read or write) on connection 'lin'"
    assert denied.decision_data("tc", "mcp__lin__delete_issue")["access"] is None
    allowed = decide(spec, "mcp__lin__list_issues", {}, registered_calls=1)
    assert (allowed.verdict, allowed.access) == ("allow", "read")
    assert allowed.decision_data("tc", "mcp__lin__list_issues")["access"] == "read"
    assert tool_access(spec, "mcp__lin__delete_issue") is None
    assert tool_access(spec, "mcp__lin__list_issues") == ("read", None)


def test_an_unclassified_tool_is_not_listed_to_the_runner() -> None:
    class Settings:
        socket_path = __import__("pathlib").Path("/tmp/x.sock")
        heartbeat_secs = 1.0
        token_ttl_secs = 60
        gateway_staleness_secs = 5.0
        replay_delay_ms = 0

    env = runner_env(spec_with(frozen(DECL, "list_issues", "delete_issue")), Settings())  # type: ignore[arg-type]
    assert "list_issues" in env["FLUIDBOX_CAPABILITIES"] and "delete_issue" not in env["FLUIDBOX_CAPABILITIES"]


def test_a_write_that_always_needs_approval_asks_a_human_or_is_denied_when_autonomous() -> None:
    tools = frozen(DECL, "create_issue")
    supervised = decide(spec_with(tools), "mcp__lin__create_issue", {}, registered_calls=1)
    assert (supervised.verdict, supervised.source, supervised.access) == ("require_approval", "access", "write")
    assert supervised.policy is not None and supervised.policy.scope == "once" and supervised.policy.scope_key is None
    autonomous = decide(spec_with(tools, autonomy="autonomous"), "mcp__lin__create_issue", {}, registered_calls=1)
    assert (autonomous.verdict, autonomous.source) == ("deny", "access")
    assert "always needs human approval" in (autonomous.reason or "")
    # Autonomy that would turn an approval into an allow cannot either.
    lenient = {
        "name": "lenient",
        "autonomy": {"on_approval_rule": "allow"},
        "tools": [{"match": ["*"], "action": "approve"}],
    }
    rewritten = decide(spec_with(tools, lenient, "autonomous"), "mcp__lin__create_issue", {}, registered_calls=1)
    assert rewritten.verdict == "deny"
    # A policy deny stays a policy deny.
    deny = {"name": "deny", "tools": [{"match": ["*"], "action": "deny"}]}
    assert decide(spec_with(tools, deny), "mcp__lin__create_issue", {}, registered_calls=1).source == "policy"


def test_a_write_left_to_the_policy_follows_the_policy() -> None:
    decl = parse_access({"write": {"approval": "policy"}})
    tools = frozen(decl, "create_issue")
    auto = decide(spec_with(tools, autonomy="autonomous"), "mcp__lin__create_issue", {}, registered_calls=1)
    assert (auto.verdict, auto.access) == ("allow", "write")


def test_an_entry_frozen_before_access_classes_keeps_working_as_a_policy_write() -> None:
    spec = spec_with([{"name": "list_issues", "input_schema": {"type": "object"}}])
    decision = decide(spec, "mcp__lin__list_issues", {}, registered_calls=1)
    assert (decision.verdict, decision.access) == ("allow", "write")
    assert classify(LEGACY, "anything") == ("write", "policy")


def test_policy_rules_match_by_access_class() -> None:
    policy = parse_policy(
        {
            "name": "by-class",
            "defaults": {"tool_action": "deny"},
            "tools": [
                {"access": "write", "action": "approve", "risk": "writes need a look"},
                {"match": ["mcp__*"], "access": "read", "action": "allow"},
            ],
        }
    )
    assert policy.tools[0].match == ["*"]
    assert evaluate(policy, "mcp__lin__create_issue", {}, autonomous=False, access="write").action == (
        "require_approval"
    )
    assert evaluate(policy, "mcp__lin__list_issues", {}, autonomous=False, access="read").action == "allow"
    assert evaluate(policy, "Bash", {}, autonomous=False).action == "deny"
    spec = spec_with(frozen(parse_access({"read": {"tools": ["list_*"]}, "write": {"tools": ["create_*"],
                     "approval": "policy"}}), "list_issues", "create_issue"), policy.model_dump())  # fmt: skip
    assert decide(spec, "mcp__lin__list_issues", {}, registered_calls=1).verdict == "allow"
    assert decide(spec, "mcp__lin__create_issue", {}, registered_calls=1).verdict == "require_approval"
    with pytest.raises(Unprocessable, match="access"):
        parse_policy({"name": "bad", "tools": [{"access": "delete", "action": "allow"}]})


def test_the_matrix_shows_each_brokered_tool_with_its_class() -> None:
    policy = parse_policy({"name": "m", "tools": [{"access": "read", "action": "allow"}]})
    rows = {
        r["tool"]: r
        for r in matrix(
            policy,
            {
                "mcp__lin__list_issues": ("read", None),
                "mcp__lin__create_issue": ("write", "always"),
                "mcp__lin__delete_issue": (None, None),
            },
        )
    }
    assert rows["mcp__lin__list_issues"]["access"] == "read"
    assert rows["mcp__lin__list_issues"]["status"]["action"] == "allow"
    assert rows["mcp__lin__create_issue"]["status"] == {"status": "default", "action": "approve", "approval": "always"}
    assert rows["mcp__lin__delete_issue"]["status"] == {"status": "unclassified", "action": "deny"}
    assert "access" not in rows["Bash"]


def test_a_definition_diff_is_readable() -> None:
    before = definition({"name": "a", "description": "old", "input_schema": {"type": "object"}})
    after = definition({"name": "a", "description": "new", "input_schema": {"type": "object"}})
    fields, text = definition_diff(before, after)
    assert fields == ["description"]
    assert '-  "description": "old",' in text and '+  "description": "new",' in text
    fields, text = definition_diff(None, after)
    assert fields == ["description", "input_schema"] and text.startswith("--- approved")
