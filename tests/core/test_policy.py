"""Policy parsing and evaluation: the seeded documents, strict parsing, scope keys and autonomy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import Unprocessable
from core.policy import MAX_RULES, Policy, PolicyVerdict, candidate_paths, evaluate, parse_policy

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def _load(name: str) -> Policy:
    return parse_policy(yaml.safe_load((POLICIES / f"{name}.yaml").read_text()))


@pytest.fixture(scope="module")
def default() -> Policy:
    return _load("default")


@pytest.fixture(scope="module")
def demo() -> Policy:
    return _load("demo")


def _ev(policy: Policy, tool: str, tool_input: dict[str, Any] | None = None, **kw: Any) -> PolicyVerdict:
    return evaluate(policy, tool, tool_input or {}, autonomous=kw.get("autonomous", False))


def _bash(command: str) -> dict[str, Any]:
    return {"command": command}


# --- the seeded documents parse strictly ---------------------------------------------------------


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_seeded_policy_parses_strictly_and_its_name_matches_its_file(path: Path) -> None:
    policy = parse_policy(yaml.safe_load(path.read_text()))
    assert policy.name == path.stem


def test_default_policy_carries_the_spec_budgets_and_autonomy(default: Policy) -> None:
    assert default.defaults.tool_action == "approve"
    assert default.budgets.max_wall_clock_secs == 1800
    assert default.budgets.max_tokens == 1_000_000
    assert default.budgets.max_cost_usd == 2.5
    assert default.budgets.max_tool_calls == 100
    assert default.autonomy.permitted is True
    assert default.autonomy.on_approval_rule == "deny"


# --- default policy table ------------------------------------------------------------------------

DEFAULT_TABLE: list[tuple[str, dict[str, Any], str]] = [
    ("Read", {"file_path": "/etc/passwd"}, "allow"),
    ("Glob", {"pattern": "**/*.py"}, "allow"),
    ("Grep", {"pattern": "x"}, "allow"),
    ("TodoWrite", {}, "allow"),
    ("Agent", {}, "deny"),
    ("Task", {}, "deny"),
    ("Workflow", {}, "deny"),
    ("Skill", {}, "deny"),
    ("TaskCreate", {}, "deny"),
    ("Edit", {"file_path": "/workspace/src/x.py"}, "allow"),
    ("Write", {"file_path": "/workspace/README.md"}, "allow"),
    ("Edit", {"file_path": "/workspace/.env"}, "deny"),
    ("Edit", {"file_path": "/workspace/config/.env.local"}, "deny"),
    ("Write", {"file_path": "/workspace/.git/config"}, "deny"),
    ("Write", {"file_path": "/workspace/.git/hooks/pre-commit"}, "deny"),
    ("Edit", {"file_path": "/etc/passwd"}, "require_approval"),
    ("Edit", {}, "require_approval"),
    ("Bash", _bash("ls -la"), "allow"),
    ("Bash", _bash("ls"), "allow"),
    ("Bash", _bash("  pytest -q  "), "allow"),
    ("Bash", _bash("git status"), "allow"),
    ("Bash", _bash("npm test -- --watch=false"), "allow"),
    ("Bash", _bash("./run_tests.sh"), "allow"),
    ("Bash", _bash("curl x"), "deny"),
    ("Bash", _bash("ls && curl http://evil"), "deny"),
    ("Bash", _bash("wget http://x"), "deny"),
    ("Bash", _bash("sudo rm"), "deny"),
    ("Bash", _bash("rm -rf /"), "deny"),
    ("Bash", _bash("git push --force origin main"), "deny"),
    ("Bash", _bash("cat /etc/passwd"), "deny"),
    ("Bash", _bash("chmod 777 x"), "deny"),
    ("Bash", _bash("docker ps"), "require_approval"),
    ("Bash", _bash("lsof"), "require_approval"),
    ("Bash", _bash("catalog"), "require_approval"),
    ("Bash", _bash("git push origin main"), "require_approval"),
    ("Bash", {}, "require_approval"),
    ("BashOutput", _bash("ls"), "allow"),
    ("WebFetch", {"url": "https://example.com"}, "deny"),
    ("WebSearch", {"query": "x"}, "deny"),
    ("TaskStop", {}, "require_approval"),
    ("SendMessage", {}, "require_approval"),
    ("mcp__x__y", {}, "require_approval"),
    ("mcp__github__create_issue", {"title": "t"}, "require_approval"),
    ("SomethingNew", {}, "require_approval"),
]


@pytest.mark.parametrize(("tool", "tool_input", "action"), DEFAULT_TABLE, ids=[f"{t}:{i}" for t, i, _ in DEFAULT_TABLE])
def test_default_policy_verdict_table(default: Policy, tool: str, tool_input: dict[str, Any], action: str) -> None:
    assert _ev(default, tool, tool_input).action == action


def test_default_denies_nested_agent_tools_with_the_rule_risk_as_reason(default: Policy) -> None:
    verdict = _ev(default, "Agent")
    assert verdict.action == "deny"
    assert verdict.rule == 1
    assert verdict.reason == "nested agents run tools the gate cannot see"


def test_default_denies_an_env_edit_naming_the_path_and_the_glob(default: Policy) -> None:
    verdict = _ev(default, "Edit", {"file_path": "/workspace/.env"})
    assert verdict.reason == 'path "/workspace/.env" matches deny glob "**/.env"'
    assert verdict.rule == 2


def test_default_escalates_an_edit_outside_the_allow_globs_to_approval_although_the_rule_allows(
    default: Policy,
) -> None:
    verdict = _ev(default, "Edit", {"file_path": "/etc/passwd"})
    assert verdict.action == "require_approval"
    assert verdict.rule == 2
    assert verdict.ttl_secs == 600
    assert verdict.scope == "once"
    assert verdict.scope_key == "Edit"


def test_multi_edit_with_one_path_outside_the_workspace_needs_approval(default: Policy) -> None:
    tool_input = {"edits": [{"file_path": "/workspace/a.py"}, {"file_path": "/tmp/b.py"}]}
    assert _ev(default, "MultiEdit", tool_input).action == "require_approval"


def test_multi_edit_with_one_path_on_a_deny_glob_is_denied(default: Policy) -> None:
    tool_input = {"edits": [{"file_path": "/workspace/a.py"}, {"file_path": "/workspace/.env"}]}
    assert _ev(default, "MultiEdit", tool_input).action == "deny"


def test_candidate_paths_come_from_every_path_key_and_from_edits() -> None:
    tool_input = {
        "file_path": "/a",
        "path": "/b",
        "notebook_path": "/c",
        "filePath": "/d",
        "edits": [{"file_path": "/e"}, {"old": "x"}, "junk"],
        "other": "/f",
    }
    assert candidate_paths(tool_input) == ["/a", "/b", "/c", "/d", "/e"]


def test_deny_regex_wins_over_allow_prefix(default: Policy) -> None:
    verdict = _ev(default, "Bash", _bash("cat /etc/passwd"))
    assert verdict.action == "deny"
    assert verdict.reason == 'shell command matches deny pattern "/etc/passwd"'


def test_lsof_is_not_matched_by_the_ls_prefix_and_falls_to_on_no_match(default: Policy) -> None:
    verdict = _ev(default, "Bash", _bash("lsof"))
    assert verdict.action == "require_approval"
    assert verdict.scope_key == "Bash:command:lsof"


def test_a_prefix_followed_by_a_tab_matches_on_the_token_boundary(default: Policy) -> None:
    assert _ev(default, "Bash", _bash("ls\t-la")).action == "allow"


def test_default_denies_web_tools_because_the_sandbox_has_no_network(default: Policy) -> None:
    verdict = _ev(default, "WebFetch", {"url": "https://example.com"})
    assert verdict.action == "deny"
    assert verdict.reason == "the sandbox has no network"


def test_default_asks_approval_for_any_mcp_tool_as_an_external_system(default: Policy) -> None:
    verdict = _ev(default, "mcp__x__y")
    assert verdict.action == "require_approval"
    assert verdict.risk == "an external system"
    assert verdict.reason == "an external system"
    assert verdict.scope_key == "mcp__x__y"


def test_a_tool_matching_no_rule_takes_the_default_action_with_no_rule_index(default: Policy) -> None:
    verdict = _ev(default, "SomethingNew")
    assert verdict.rule is None
    assert verdict.action == "require_approval"
    assert verdict.reason == "requires human approval"
    assert verdict.scope_key == "SomethingNew"


# --- demo policy ---------------------------------------------------------------------------------


def test_demo_allows_the_test_script(demo: Policy) -> None:
    assert _ev(demo, "Bash", _bash("./run_tests.sh")).action == "allow"
    assert _ev(demo, "Bash", _bash("./run_tests.sh -k foo")).action == "allow"


def test_demo_denies_curl_naming_the_pattern(demo: Policy) -> None:
    verdict = _ev(demo, "Bash", _bash("curl https://example.com"))
    assert verdict.action == "deny"
    assert verdict.reason == 'shell command matches deny pattern "\\bcurl\\b"'


def test_demo_sends_deploy_to_a_human_for_180_seconds(demo: Policy) -> None:
    verdict = _ev(demo, "Bash", _bash("./deploy.sh"))
    assert verdict.action == "require_approval"
    assert verdict.ttl_secs == 180
    assert verdict.scope == "once"
    assert verdict.risk == "releases the build to production"
    assert verdict.scope_key == "Bash:command:./deploy.sh"


def test_demo_cat_prefix_with_trailing_space_matches_cat_with_an_argument(demo: Policy) -> None:
    assert _ev(demo, "Bash", _bash("cat README.md")).action == "allow"
    assert _ev(demo, "Bash", _bash("catalog")).action == "require_approval"


@pytest.mark.parametrize(
    ("tool_input", "action"),
    [
        ({"file_path": "/workspace/app.py"}, "allow"),
        ({"file_path": "/workspace/.env"}, "deny"),
        ({"file_path": "/workspace/secrets.json"}, "deny"),
        ({"file_path": "/home/user/app.py"}, "require_approval"),
    ],
)
def test_demo_edit_table(demo: Policy, tool_input: dict[str, Any], action: str) -> None:
    assert _ev(demo, "Edit", tool_input).action == action


# --- paths are normalised before matching (.. and . cannot escape a glob) ---------------------------


def test_a_dotdot_path_escaping_the_workspace_is_not_treated_as_inside_it(default: Policy) -> None:
    assert _ev(default, "Edit", {"file_path": "/workspace/../etc/passwd"}).action == "require_approval"


def test_a_dot_segment_does_not_slip_past_a_deny_glob(default: Policy) -> None:
    assert _ev(default, "Write", {"file_path": "/workspace/.git/./config"}).action == "deny"


# --- strict parsing ------------------------------------------------------------------------------


def _doc(**extra: Any) -> dict[str, Any]:
    return {"name": "p", **extra}


@pytest.mark.parametrize(
    ("document", "key"),
    [
        (_doc(colour="blue"), "colour"),
        (_doc(defaults={"tool_action": "allow", "fallback": "deny"}), "fallback"),
        (_doc(budgets={"max_tool_calls": 3, "max_calls": 3}), "max_calls"),
        (_doc(approvals={"ttl": 10}), "ttl"),
        (_doc(autonomy={"permited": True}), "permited"),
        (_doc(tools=[{"match": ["Read"], "action": "allow", "when": "always"}]), "when"),
        (
            _doc(tools=[{"match": ["Bash"], "action": "allow", "shell": {"allowprefix": ["ls"]}}]),
            "tools.0.shell.allowprefix",
        ),
        (
            _doc(
                tools=[
                    {"match": ["Read"], "action": "allow"},
                    {"match": ["Edit"], "action": "allow", "paths": {"allow": [], "exclude": ["x"]}},
                ]
            ),
            "tools.1.paths.exclude",
        ),
    ],
)
def test_an_unknown_key_at_any_level_is_unprocessable_naming_the_key(document: dict[str, Any], key: str) -> None:
    with pytest.raises(Unprocessable) as info:
        parse_policy(document)
    assert info.value.status == 422
    assert "unknown key '" in info.value.message
    assert key in info.value.message


def test_an_unknown_nested_shell_key_is_reported_with_its_full_path() -> None:
    document = _doc(tools=[{"match": ["Bash"], "action": "allow", "shell": {"allowprefix": ["ls"]}}])
    with pytest.raises(Unprocessable, match=r"unknown key 'tools\.0\.shell\.allowprefix'"):
        parse_policy(document)


def test_a_deny_regex_that_does_not_compile_is_unprocessable() -> None:
    document = _doc(tools=[{"match": ["Bash"], "action": "allow", "shell": {"deny_regex": ["(unclosed"]}}])
    with pytest.raises(Unprocessable) as info:
        parse_policy(document)
    assert "(unclosed" in info.value.message
    assert "tools.0.shell.deny_regex" in info.value.message


def test_an_empty_match_list_is_unprocessable() -> None:
    with pytest.raises(Unprocessable, match=r"tools\.0\.match"):
        parse_policy(_doc(tools=[{"match": [], "action": "allow"}]))


def test_a_rule_without_match_or_action_is_unprocessable() -> None:
    with pytest.raises(Unprocessable, match=r"tools\.0\.match"):
        parse_policy(_doc(tools=[{"action": "allow"}]))
    with pytest.raises(Unprocessable, match=r"tools\.0\.action"):
        parse_policy(_doc(tools=[{"match": ["Read"]}]))


@pytest.mark.parametrize("action", ["permit", "ask", "require_approval", ""])
def test_an_unknown_action_is_unprocessable(action: str) -> None:
    with pytest.raises(Unprocessable):
        parse_policy(_doc(tools=[{"match": ["Read"], "action": action}]))


def test_exactly_512_rules_parse_but_513_are_unprocessable() -> None:
    rule = {"match": ["Read"], "action": "allow"}
    assert len(parse_policy(_doc(tools=[rule] * MAX_RULES)).tools) == 512
    with pytest.raises(Unprocessable, match="512"):
        parse_policy(_doc(tools=[rule] * (MAX_RULES + 1)))


def test_more_than_256_patterns_in_a_constraint_list_is_unprocessable() -> None:
    with pytest.raises(Unprocessable, match="256"):
        parse_policy(_doc(tools=[{"match": [f"T{i}" for i in range(257)], "action": "allow"}]))
    with pytest.raises(Unprocessable, match="256"):
        parse_policy(_doc(tools=[{"match": ["Edit"], "action": "allow", "paths": {"deny": ["x"] * 257}}]))


def test_a_pattern_longer_than_1024_bytes_is_unprocessable() -> None:
    long = "é" * 513  # 1026 bytes, 513 characters
    with pytest.raises(Unprocessable, match="1024"):
        parse_policy(_doc(tools=[{"match": ["Bash"], "action": "allow", "shell": {"allow_prefixes": [long]}}]))


def test_a_missing_or_empty_name_is_unprocessable() -> None:
    with pytest.raises(Unprocessable, match="name"):
        parse_policy({"tools": []})
    with pytest.raises(Unprocessable, match="name"):
        parse_policy({"name": ""})


def test_a_document_that_is_not_a_mapping_is_unprocessable() -> None:
    with pytest.raises(Unprocessable):
        parse_policy(["not", "a", "mapping"])
    with pytest.raises(Unprocessable):
        parse_policy(None)


def test_an_omitted_budgets_block_takes_the_defaults_and_missing_fields_in_a_given_block_are_uncapped() -> None:
    omitted = parse_policy(_doc())
    assert omitted.budgets.max_tool_calls == 100
    assert omitted.budgets.max_tokens == 1_000_000
    partial = parse_policy(_doc(budgets={"max_cost_usd": 25}))
    assert partial.budgets.max_cost_usd == 25
    assert partial.budgets.max_tokens is None
    assert partial.budgets.max_tool_calls is None
    assert partial.budgets.max_wall_clock_secs is None


# --- shell rules judge the words the shell runs, not their spelling -------------------------------


def _shell_policy(**shell: Any) -> Policy:
    return parse_policy(_doc(tools=[{"match": ["Bash"], "action": "allow", "shell": shell}]))


@pytest.mark.parametrize(
    "command",
    ['git diff "--output=x"', "git diff '--output'=x", "git diff --o\\utput=x", "git diff $'\\x2d-output=x'",
     'git diff $"--output"=x', "git diff \\--output=x"],
)  # fmt: skip
def test_a_deny_pattern_sees_the_command_as_the_shell_unquotes_it(command: str) -> None:
    policy = _shell_policy(allow_prefixes=["git diff"], deny_regex=[r"\s--output\b"], on_no_match="allow")
    verdict = _ev(policy, "Bash", _bash(command))
    assert verdict.action == "deny", command
    assert verdict.reason == r'shell command matches deny pattern "\s--output\b" once the shell unquotes it'


def test_a_deny_pattern_that_hits_the_command_as_written_says_so_plainly() -> None:
    policy = _shell_policy(deny_regex=[r"\bcurl\b"], on_no_match="allow")
    assert _ev(policy, "Bash", _bash("curl x")).reason == r'shell command matches deny pattern "\bcurl\b"'


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        ("git status", True),
        ("git   status --short", True),
        ('"git" status', True),
        ("g\\it 'status'", True),
        ('"git status"', False),  # one word: bash would look for a program called "git status"
        ("git statuses", False),
        ("git", False),
        ("gitstatus", False),
    ],
)
def test_an_allow_prefix_is_matched_word_by_word(command: str, allowed: bool) -> None:
    policy = _shell_policy(allow_prefixes=["git status"], on_no_match="deny")
    assert (_ev(policy, "Bash", _bash(command)).action == "allow") is allowed


def test_a_prefix_is_itself_split_into_words_and_one_that_cannot_be_never_matches() -> None:
    policy = _shell_policy(allow_prefixes=['python  -m "pytest"', "cat 'x"], on_no_match="deny")
    assert _ev(policy, "Bash", _bash("python -m pytest -q")).action == "allow"
    assert _ev(policy, "Bash", _bash("cat 'x")).action == "deny"
    assert _ev(policy, "Bash", _bash("cat x")).action == "deny"


def test_a_prefix_of_no_words_matches_only_the_empty_command() -> None:
    policy = _shell_policy(allow_prefixes=[""], on_no_match="deny")
    assert _ev(policy, "Bash", _bash("")).action == "allow"
    assert _ev(policy, "Bash", _bash("ls")).action == "deny"


@pytest.mark.parametrize(
    ("command", "what"),
    [("cat 'notes", "single quote"), ('grep "a b', "double quote"), ("ls $'x", "ANSI-C quote")],
)
def test_a_command_that_cannot_be_split_into_words_is_denied_saying_why(command: str, what: str) -> None:
    # Even where an unmatched command would be allowed: nothing can judge what such a line runs.
    policy = _shell_policy(allow_prefixes=["cat", "grep", "ls"], on_no_match="allow")
    verdict = _ev(policy, "Bash", _bash(command))
    assert verdict.action == "deny"
    assert verdict.reason is not None and verdict.reason.startswith("shell command cannot be split into words")
    assert what in verdict.reason


# --- session-scope keys never widen --------------------------------------------------------------


def _approving_shell_policy(**shell: Any) -> Policy:
    return parse_policy(_doc(tools=[{"match": ["Bash"], "action": "approve", "shell": shell}]))


def test_on_no_match_scope_key_is_the_exact_command_not_its_first_word(default: Policy) -> None:
    verdict = _ev(default, "Bash", _bash("git push origin main"))
    assert verdict.action == "require_approval"
    assert verdict.scope_key == "Bash:command:git push origin main"
    assert verdict.scope_key != "Bash:command:git"


def test_on_no_match_scope_key_is_the_trimmed_command(default: Policy) -> None:
    assert _ev(default, "Bash", _bash("  docker ps  ")).scope_key == "Bash:command:docker ps"


def test_two_commands_sharing_a_first_word_get_different_scope_keys(default: Policy) -> None:
    push = _ev(default, "Bash", _bash("git push origin main")).scope_key
    fetch = _ev(default, "Bash", _bash("git fetch origin")).scope_key
    assert push != fetch


def test_a_matched_allow_prefix_is_the_scope_key() -> None:
    policy = _approving_shell_policy(allow_prefixes=["git push"], on_no_match="deny")
    verdict = _ev(policy, "Bash", _bash("git push origin main"))
    assert verdict.action == "require_approval"
    assert verdict.scope_key == "Bash:prefix:git push"


def test_a_matched_prefix_with_trailing_space_gives_a_stripped_scope_key() -> None:
    policy = _approving_shell_policy(allow_prefixes=["cat "], on_no_match="deny")
    assert _ev(policy, "Bash", _bash("cat notes.txt")).scope_key == "Bash:prefix:cat "


def test_approving_a_bare_command_for_the_session_does_not_widen_to_a_prefix_rule() -> None:
    policy = _approving_shell_policy(allow_prefixes=["cat "], on_no_match="approve")
    bare = _ev(policy, "Bash", _bash("cat")).scope_key
    wider = _ev(policy, "Bash", _bash("cat /etc/shadow")).scope_key
    assert bare != wider


def test_the_scope_keys_stay_the_exact_command_and_the_prefix_as_written() -> None:
    policy = _approving_shell_policy(allow_prefixes=["git  push"], on_no_match="approve")
    assert _ev(policy, "Bash", _bash('"git" push origin')).scope_key == "Bash:prefix:git  push"
    assert _ev(policy, "Bash", _bash(' git  fetch "origin" ')).scope_key == 'Bash:command:git  fetch "origin"'


def test_a_non_shell_rule_scope_key_is_the_tool_name(default: Policy) -> None:
    assert _ev(default, "TaskStop").scope_key == "TaskStop"


def test_a_rule_ttl_and_scope_override_the_approvals_defaults() -> None:
    policy = parse_policy(
        _doc(
            approvals={"default_ttl_secs": 900, "scope": "once"},
            tools=[
                {"match": ["A"], "action": "approve", "approval_ttl_secs": 120, "approval_scope": "session"},
                {"match": ["B"], "action": "approve"},
            ],
        )
    )
    a = _ev(policy, "A")
    b = _ev(policy, "B")
    assert (a.ttl_secs, a.scope) == (120, "session")
    assert (b.ttl_secs, b.scope) == (900, "once")


# --- autonomy ------------------------------------------------------------------------------------


def test_autonomous_run_turns_require_approval_into_deny_under_fallback_deny(default: Policy) -> None:
    verdict = _ev(default, "Bash", _bash("docker ps"), autonomous=True)
    assert verdict.action == "deny"
    assert verdict.original_action == "require_approval"
    assert verdict.reason == "requires human approval; run is autonomous (policy fallback: deny)"
    assert verdict.rule == 3


def test_autonomous_run_under_fallback_allow_turns_require_approval_into_allow() -> None:
    policy = parse_policy(_doc(autonomy={"on_approval_rule": "allow"}))
    verdict = _ev(policy, "Anything", autonomous=True)
    assert verdict.action == "allow"
    assert verdict.original_action == "require_approval"
    assert verdict.rule is None


def test_rule_on_autonomous_allow_overrides_a_policy_fallback_of_deny() -> None:
    policy = parse_policy(
        _doc(
            autonomy={"on_approval_rule": "deny"},
            tools=[{"match": ["Bash"], "action": "approve", "on_autonomous": "allow"}],
        )
    )
    verdict = _ev(policy, "Bash", _bash("make deploy"), autonomous=True)
    assert verdict.action == "allow"
    assert verdict.original_action == "require_approval"
    # Tools that reach no rule still use the policy fallback.
    assert _ev(policy, "Other", autonomous=True).action == "deny"


def test_rule_on_autonomous_deny_overrides_a_policy_fallback_of_allow() -> None:
    policy = parse_policy(
        _doc(
            autonomy={"on_approval_rule": "allow"},
            tools=[{"match": ["Bash"], "action": "approve", "on_autonomous": "deny"}],
        )
    )
    verdict = _ev(policy, "Bash", _bash("make deploy"), autonomous=True)
    assert verdict.action == "deny"
    assert verdict.original_action == "require_approval"


def test_autonomy_leaves_allow_and_deny_verdicts_untouched(default: Policy) -> None:
    for tool, tool_input in [("Read", {}), ("Agent", {}), ("Bash", _bash("curl x")), ("Bash", _bash("ls"))]:
        supervised = _ev(default, tool, tool_input)
        autonomous = _ev(default, tool, tool_input, autonomous=True)
        assert autonomous == supervised
        assert autonomous.original_action is None


# --- tool-name matching --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "tool", "hit"),
    [
        ("*", "Anything", True),
        ("mcp__*", "mcp__gh__issue", True),
        ("mcp__*", "mcp_", False),
        ("mcp__gh__*", "mcp__gh__issue", True),
        ("mcp__gh__*", "mcp__ghx__issue", False),
        ("Read", "Read", True),
        ("Read", "ReadMore", False),
        ("Read", "read", False),
    ],
)
def test_match_is_exact_or_trailing_star_prefix_or_star_for_all(pattern: str, tool: str, hit: bool) -> None:
    policy = parse_policy(_doc(defaults={"tool_action": "deny"}, tools=[{"match": [pattern], "action": "allow"}]))
    assert (_ev(policy, tool).action == "allow") is hit


def test_first_matching_rule_wins_even_when_a_later_rule_is_more_specific() -> None:
    policy = parse_policy(
        _doc(tools=[{"match": ["mcp__*"], "action": "deny"}, {"match": ["mcp__gh__read"], "action": "allow"}])
    )
    verdict = _ev(policy, "mcp__gh__read")
    assert (verdict.action, verdict.rule) == ("deny", 0)
