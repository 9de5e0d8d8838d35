"""The permission gate's fixed order: budget → frozen tool set → trust tier → policy → session scope."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.gate import READ_ONLY_TOOLS, GateDecision, decide, frozen_tools
from core.policy import Budgets, evaluate
from core.runspec import RunSpec, WorkspaceSpec
from tests.helpers import examples

ALLOW_ALL: dict[str, Any] = {
    "name": "allow-all",
    "defaults": {"tool_action": "allow"},
    "tools": [{"match": ["*"], "action": "allow"}],
}
APPROVE_ALL: dict[str, Any] = {"name": "approve-all", "defaults": {"tool_action": "approve"}}
SHELL: dict[str, Any] = {
    "name": "shell",
    "defaults": {"tool_action": "approve"},
    "tools": [
        {"match": ["Read"], "action": "allow"},
        {"match": ["mcp__*"], "action": "allow"},
        {
            "match": ["Bash"],
            "action": "allow",
            "shell": {
                "allow_prefixes": ["ls", "git status"],
                "deny_regex": [r"\bcurl\b"],
                "on_no_match": "approve",
            },
        },
    ],
}

CAPABILITIES = [{"name": "gh", "version": "1", "servers": [{"name": "github", "tools": [{"name": "create_issue"}]}]}]
BROKERED = [{"slot": "linear", "tools": [{"name": "list_issues"}, {"name": "create_issue"}]}]


def make_spec(
    policy: dict[str, Any] = ALLOW_ALL,
    *,
    autonomy: str = "supervised",
    trust_tier: str = "trusted",
    max_tool_calls: int | None = 100,
    capabilities: list[dict[str, Any]] | None = None,
    brokered: list[dict[str, Any]] | None = None,
) -> RunSpec:
    return RunSpec(
        run_id="run-1",
        tenant_id="tenant-1",
        agent_id="agent-1",
        agent_revision_id="rev-1",
        agent_name="tester",
        harness="replay",
        model="replay",
        task="test the gate",
        workspace=WorkspaceSpec(),
        autonomy=autonomy,  # type: ignore[arg-type]
        trust_tier=trust_tier,  # type: ignore[arg-type]
        budgets=Budgets(max_tool_calls=max_tool_calls),
        policy_id="policy-1",
        policy_name=policy["name"],
        policy_version=1,
        policy_snapshot=policy,
        capabilities=CAPABILITIES if capabilities is None else capabilities,
        brokered=BROKERED if brokered is None else brokered,
    )


def _decide(spec: RunSpec, tool: str, tool_input: dict[str, Any] | None = None, **kw: Any) -> GateDecision:
    return decide(spec, tool, tool_input or {}, registered_calls=kw.pop("registered_calls", 1), **kw)


# --- 1. tool-call budget -------------------------------------------------------------------------


def test_with_max_two_tool_calls_the_third_call_is_denied_as_budget_exceeded_although_policy_allows() -> None:
    spec = make_spec(ALLOW_ALL, max_tool_calls=2)
    assert _decide(spec, "Read", registered_calls=1).verdict == "allow"
    assert _decide(spec, "Read", registered_calls=2).verdict == "allow"
    third = _decide(spec, "Read", registered_calls=3)
    assert third.verdict == "deny"
    assert third.source == "budget"
    assert third.budget_exceeded is True
    assert third.reason == "tool-call budget exceeded"
    assert third.policy is None  # the policy was never consulted


def test_a_call_within_budget_is_not_flagged_budget_exceeded() -> None:
    decision = _decide(make_spec(max_tool_calls=2), "Read", registered_calls=2)
    assert decision.budget_exceeded is False


def test_an_uncapped_tool_call_budget_never_denies() -> None:
    decision = _decide(make_spec(max_tool_calls=None), "Read", registered_calls=10_000)
    assert decision.verdict == "allow"


def test_a_zero_tool_call_budget_denies_the_first_call() -> None:
    decision = _decide(make_spec(max_tool_calls=0), "Read", registered_calls=1)
    assert (decision.verdict, decision.source, decision.budget_exceeded) == ("deny", "budget", True)


def test_the_budget_is_checked_before_the_frozen_tool_set_and_the_trust_tier() -> None:
    spec = make_spec(ALLOW_ALL, max_tool_calls=1, trust_tier="read_only")
    assert _decide(spec, "mcp__evil__x", registered_calls=2).source == "budget"
    assert _decide(spec, "Write", {"file_path": "/workspace/x"}, registered_calls=2).source == "budget"


# --- 2. frozen tool set --------------------------------------------------------------------------


def test_frozen_tools_come_from_capability_servers_and_brokered_slots() -> None:
    assert frozen_tools(make_spec()) == {
        "mcp__github__create_issue",
        "mcp__linear__list_issues",
        "mcp__linear__create_issue",
    }


def test_an_mcp_tool_outside_the_frozen_set_is_denied_by_capability_even_when_policy_allows_mcp_star() -> None:
    spec = make_spec(SHELL)
    assert evaluate(spec.policy(), "mcp__github__delete_repo", {}, autonomous=False).action == "allow"
    decision = _decide(spec, "mcp__github__delete_repo")
    assert decision.verdict == "deny"
    assert decision.source == "capability"
    assert decision.reason == "tool 'mcp__github__delete_repo' is not in this run's frozen tool set"


@pytest.mark.parametrize("tool", ["mcp__github__create_issue", "mcp__linear__list_issues"])
def test_a_frozen_mcp_tool_reaches_the_policy(tool: str) -> None:
    decision = _decide(make_spec(SHELL), tool)
    assert (decision.verdict, decision.source) == ("allow", "policy")


def test_a_run_with_no_frozen_tools_denies_every_mcp_tool() -> None:
    spec = make_spec(ALLOW_ALL, capabilities=[], brokered=[])
    assert frozen_tools(spec) == frozenset()
    assert _decide(spec, "mcp__github__create_issue").source == "capability"


def test_a_non_mcp_tool_is_not_subject_to_the_frozen_set() -> None:
    spec = make_spec(ALLOW_ALL, capabilities=[], brokered=[])
    assert _decide(spec, "SomeBuiltin").verdict == "allow"


def test_the_frozen_set_check_precedes_the_trust_tier() -> None:
    spec = make_spec(ALLOW_ALL, trust_tier="read_only")
    assert _decide(spec, "mcp__unknown__x").source == "capability"
    assert _decide(spec, "mcp__github__create_issue").source == "trust_tier"


# --- 3. trust tier -------------------------------------------------------------------------------

READ_ONLY_DENIED: list[tuple[str, dict[str, Any]]] = [
    ("Write", {"file_path": "/workspace/f"}),
    ("Edit", {"file_path": "/workspace/f"}),
    ("Bash", {"command": "echo hi > f"}),
    ("Bash", {"command": "rm x"}),
    ("Bash", {"command": "ls; rm x"}),
    ("Bash", {"command": "cat a | sh"}),
    ("Bash", {"command": "cat $(whoami)"}),
    ("Bash", {"command": "ls `id`"}),
    ("Bash", {"command": "ls && rm x"}),
    ("Bash", {"command": "ls\nrm x"}),
    ("Bash", {"command": "lsof"}),
    ("Bash", {"command": "git push"}),
    ("Bash", {"command": "git statusx"}),
    # Writers and launchers behind listed read commands, however the shell spells them (issue 24, finding 11).
    ("Bash", {"command": "git diff --output=/workspace/x"}),
    ("Bash", {"command": 'git log "--output"=/workspace/x'}),
    ("Bash", {"command": "git show '--output'=x"}),
    ("Bash", {"command": "git diff --o\\utput=x"}),
    ("Bash", {"command": "git diff --ext-diff"}),
    ("Bash", {"command": "rg --pre sh x"}),
    ("Bash", {"command": "rg --pre=sh x"}),
    # A glob or brace could expand to a file the untrusted source named (a file called --output=x).
    ("Bash", {"command": "git diff *"}),
    ("Bash", {"command": "git diff --outpu?=x"}),
    ("Bash", {"command": "git diff --{output,x}=f"}),
    ("Bash", {"command": "cat 'unterminated"}),
    ("Bash", {}),
    ("WebFetch", {"url": "https://example.com"}),
    ("Agent", {}),
    ("BashOutput", {"command": "ls"}),
]


@pytest.mark.parametrize(("tool", "tool_input"), READ_ONLY_DENIED, ids=[f"{t}:{i}" for t, i in READ_ONLY_DENIED])
def test_read_only_trust_tier_denies_non_read_calls_under_a_policy_that_allows_everything(
    tool: str, tool_input: dict[str, Any]
) -> None:
    decision = _decide(make_spec(ALLOW_ALL, trust_tier="read_only"), tool, tool_input)
    assert decision.verdict == "deny"
    assert decision.source == "trust_tier"
    assert decision.reason is not None
    assert decision.reason.startswith("read-only trust tier (untrusted event source): ")


@pytest.mark.parametrize(("tool", "tool_input"), READ_ONLY_DENIED, ids=[f"{t}:{i}" for t, i in READ_ONLY_DENIED])
def test_no_session_scope_or_autonomy_lifts_the_read_only_floor(tool: str, tool_input: dict[str, Any]) -> None:
    permissive = {**APPROVE_ALL, "autonomy": {"on_approval_rule": "allow"}}
    spec = make_spec(permissive, trust_tier="read_only", autonomy="autonomous")
    scope_key = evaluate(spec.policy(), tool, tool_input, autonomous=False).scope_key
    keys = frozenset({tool, f"{tool}:command:{tool_input.get('command', '')}", *([scope_key] if scope_key else [])})
    decision = _decide(spec, tool, tool_input, session_scope_keys=keys)
    assert (decision.verdict, decision.source) == ("deny", "trust_tier")


@pytest.mark.parametrize(
    ("tool", "tool_input"),
    [
        ("Read", {"file_path": "/workspace/x"}),
        ("Glob", {"pattern": "**"}),
        ("Grep", {"pattern": "x"}),
        ("LS", {"path": "/workspace"}),
        ("NotebookRead", {"notebook_path": "/workspace/n.ipynb"}),
        ("Bash", {"command": "git status"}),
        ("Bash", {"command": "  git status --short  "}),
        ("Bash", {"command": "ls"}),
        ("Bash", {"command": "ls -la /workspace"}),
        ("Bash", {"command": "cat README.md"}),
        ("Bash", {"command": "git log -n 3"}),
        ("Bash", {"command": "git blame core/gate.py"}),
        ("Bash", {"command": "pwd"}),
        ("Bash", {"command": "'git' status"}),
        ("Bash", {"command": "grep -n 'two words' README.md"}),
    ],
)
def test_read_only_trust_tier_lets_read_calls_through_to_the_policy(tool: str, tool_input: dict[str, Any]) -> None:
    decision = _decide(make_spec(ALLOW_ALL, trust_tier="read_only"), tool, tool_input)
    assert (decision.verdict, decision.source) == ("allow", "policy")


def test_read_only_calls_still_obey_a_policy_deny() -> None:
    policy = {"name": "p", "tools": [{"match": ["Read"], "action": "deny", "risk": "no reading"}]}
    decision = _decide(make_spec(policy, trust_tier="read_only"), "Read", {"file_path": "/x"})
    assert (decision.verdict, decision.source, decision.reason) == ("deny", "policy", "no reading")


def test_a_trusted_run_is_not_held_to_the_read_only_floor() -> None:
    decision = _decide(make_spec(ALLOW_ALL), "Bash", {"command": "echo hi > f"})
    assert (decision.verdict, decision.source) == ("allow", "policy")


# --- 4. policy and autonomy ----------------------------------------------------------------------


def test_the_policy_verdict_is_passed_through_with_source_policy() -> None:
    spec = make_spec(SHELL)
    allow = _decide(spec, "Bash", {"command": "ls -la"})
    deny = _decide(spec, "Bash", {"command": "curl x"})
    approve = _decide(spec, "Bash", {"command": "make deploy"})
    assert (allow.verdict, allow.source) == ("allow", "policy")
    assert (deny.verdict, deny.source) == ("deny", "policy")
    assert deny.reason == 'shell command matches deny pattern "\\bcurl\\b"'
    assert (approve.verdict, approve.source) == ("require_approval", "policy")
    assert approve.policy is not None and approve.policy.scope_key == "Bash:command:make deploy"


def test_an_autonomous_run_gets_an_autonomy_rewrite_deny_with_original_verdict_require_approval() -> None:
    decision = _decide(make_spec(APPROVE_ALL, autonomy="autonomous"), "Deploy")
    assert decision.verdict == "deny"
    assert decision.source == "autonomy_rewrite"
    assert decision.original_verdict == "require_approval"
    assert decision.reason == "requires human approval; run is autonomous (policy fallback: deny)"


def test_an_autonomous_run_under_fallback_allow_gets_an_autonomy_rewrite_allow() -> None:
    policy = {**APPROVE_ALL, "autonomy": {"on_approval_rule": "allow"}}
    decision = _decide(make_spec(policy, autonomy="autonomous"), "Deploy")
    assert (decision.verdict, decision.source, decision.original_verdict) == (
        "allow",
        "autonomy_rewrite",
        "require_approval",
    )


def test_an_autonomous_run_never_leaves_an_approval_pending_even_with_a_matching_session_scope() -> None:
    decision = _decide(
        make_spec(APPROVE_ALL, autonomy="autonomous"), "Deploy", session_scope_keys=frozenset({"Deploy"})
    )
    assert decision.verdict == "deny"
    assert decision.source == "autonomy_rewrite"


def test_autonomy_does_not_rewrite_a_plain_policy_allow_or_deny() -> None:
    spec = make_spec(SHELL, autonomy="autonomous")
    assert _decide(spec, "Bash", {"command": "ls"}).source == "policy"
    assert _decide(spec, "Bash", {"command": "curl x"}).source == "policy"


# --- 5. session scope ----------------------------------------------------------------------------


def test_a_session_approved_scope_key_turns_require_approval_into_allow_with_source_session_scope() -> None:
    spec = make_spec(SHELL)
    decision = _decide(
        spec, "Bash", {"command": "make deploy"}, session_scope_keys=frozenset({"Bash:command:make deploy"})
    )
    assert decision.verdict == "allow"
    assert decision.source == "session_scope"
    assert decision.reason == "approved for the session (Bash:command:make deploy)"
    assert decision.policy is not None and decision.policy.action == "require_approval"


def test_a_session_approval_of_one_git_command_does_not_approve_another_git_command() -> None:
    spec = make_spec(SHELL)
    keys = frozenset({_decide(spec, "Bash", {"command": "git push origin main"}).policy.scope_key})  # type: ignore[union-attr]
    assert keys == {"Bash:command:git push origin main"}
    again = _decide(spec, "Bash", {"command": "git push origin main"}, session_scope_keys=keys)
    other = _decide(spec, "Bash", {"command": "git reset --hard"}, session_scope_keys=keys)
    assert (again.verdict, again.source) == ("allow", "session_scope")
    assert (other.verdict, other.source) == ("require_approval", "policy")


def test_a_first_word_scope_key_does_not_approve_commands_that_start_with_it() -> None:
    decision = _decide(
        make_spec(SHELL),
        "Bash",
        {"command": "git push origin main"},
        session_scope_keys=frozenset({"Bash:git", "git", "Bash:prefix:git", "Bash:command:git"}),
    )
    assert decision.verdict == "require_approval"


def test_a_session_scope_never_lifts_a_policy_deny() -> None:
    spec = make_spec(SHELL)
    decision = _decide(
        spec, "Bash", {"command": "curl x"}, session_scope_keys=frozenset({"Bash:command:curl x", "Bash"})
    )
    assert (decision.verdict, decision.source) == ("deny", "policy")


# --- decision data -------------------------------------------------------------------------------


def test_decision_data_carries_call_id_tool_verdict_source_and_reason() -> None:
    decision = _decide(make_spec(SHELL), "Bash", {"command": "curl x"})
    assert decision.decision_data("tc-1", "Bash") == {
        "tool_call_id": "tc-1",
        "tool": "Bash",
        "verdict": "deny",
        "source": "policy",
        "access": None,
        "reason": 'shell command matches deny pattern "\\bcurl\\b"',
    }


def test_decision_data_carries_the_original_verdict_of_an_autonomy_rewrite() -> None:
    decision = _decide(make_spec(APPROVE_ALL, autonomy="autonomous"), "Deploy")
    data = decision.decision_data("tc-2", "Deploy")
    assert data["verdict"] == "deny"
    assert data["source"] == "autonomy_rewrite"
    assert data["original_verdict"] == "require_approval"
    assert data["reason"] == "requires human approval; run is autonomous (policy fallback: deny)"


def test_decision_data_omits_absent_reason_and_original_verdict() -> None:
    data = _decide(make_spec(SHELL), "Read").decision_data("tc-3", "Read")
    assert data == {"tool_call_id": "tc-3", "tool": "Read", "verdict": "allow", "source": "policy", "access": None}


# --- a property of the floor ---------------------------------------------------------------------

_META = set(";|&`$()<>\n*?[{")


@settings(max_examples=examples(300), deadline=None, database=None)
@given(
    tool=st.sampled_from(["Read", "Glob", "Write", "Edit", "Bash", "WebFetch", "Agent", "mcp__github__create_issue"]),
    command=st.text(alphabet=st.sampled_from(list("lscatgi urm;|&`$()<>\n-x")), max_size=20),
    autonomous=st.booleans(),
)
def test_a_read_only_run_allows_only_read_tools_and_metacharacter_free_bash(
    tool: str, command: str, autonomous: bool
) -> None:
    policy = {**ALLOW_ALL, "autonomy": {"on_approval_rule": "allow"}}
    spec = make_spec(policy, trust_tier="read_only", autonomy="autonomous" if autonomous else "supervised")
    decision = _decide(
        spec, tool, {"command": command}, session_scope_keys=frozenset({tool, f"{tool}:command:{command}"})
    )
    if decision.verdict == "allow":
        assert tool in READ_ONLY_TOOLS or (tool == "Bash" and not (_META & set(command)))
    else:
        assert decision.source in {"trust_tier", "capability"}
