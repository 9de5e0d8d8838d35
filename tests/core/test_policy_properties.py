"""Property tests of the policy engine over random policies and random tool calls.

The oracles here are written from spec/domain.md section 5, independently of core.policy internals.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.policy import Budgets, Policy, evaluate, normalize_path, parse_policy
from core.runspec import intersect_budgets
from tests.helpers import examples

FAST = settings(max_examples=examples(300), deadline=None, database=None)

TOOLS = ["Read", "Edit", "Write", "Bash", "Agent", "mcp__a__b", "mcp__c__d", "Unknown"]
MATCHERS = ["Read", "Edit", "Write", "Bash", "Agent", "mcp__a__b", "mcp__*", "mcp__c*", "Ed*", "B*", "*"]
ACTIONS = ["allow", "approve", "deny"]
PREFIXES = ["ls", "git", "git status", "cat ", "echo", "rm", "./run.sh"]
DENY_REGEXES = [r"\bcurl\b", r"rm\s+-rf", r";", r"sudo", r"^git push", r"/etc/"]
GLOBS_ALLOW = ["/workspace/**", "/tmp/*", "**/*.py"]
GLOBS_DENY = ["**/.env", "/etc/*", "**/secret*", "/workspace/.git/**"]
WORDS = [
    "ls",
    "lsof",
    "git",
    "status",
    "push",
    "curl",
    "rm",
    "-rf",
    "sudo",
    "cat",
    "x",
    ";",
    "echo",
    "/etc/passwd",
    '"git"',  # quoted and escaped spellings: the engine judges the words the shell makes of them
    "'status'",
    "st\\atus",
    '"git push"',
    '"r"m',
]
PATHS = [
    "/workspace/a.py",
    "/workspace/.env",
    "/workspace/sub/secret.txt",
    "/workspace/.git/config",
    "/etc/passwd",
    "/tmp/x",
    "/tmp/deep/x.py",
    "relative.py",
]
PATH_KEYS = ("file_path", "path", "notebook_path", "filePath")


def _sub(values: list[str], max_size: int = 3) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(values), max_size=max_size, unique=True)


shell_constraints = st.fixed_dictionaries(
    {},
    optional={
        "allow_prefixes": _sub(PREFIXES, 4),
        "deny_regex": _sub(DENY_REGEXES, 3),
        "on_no_match": st.sampled_from(ACTIONS),
    },
)
path_constraints = st.fixed_dictionaries({}, optional={"allow": _sub(GLOBS_ALLOW), "deny": _sub(GLOBS_DENY)})

rules = st.fixed_dictionaries(
    {
        "match": st.lists(st.sampled_from(MATCHERS), min_size=1, max_size=3, unique=True),
        "action": st.sampled_from(ACTIONS),
    },
    optional={
        "risk": st.sampled_from(["danger", "external"]),
        "shell": shell_constraints,
        "paths": path_constraints,
        "on_autonomous": st.sampled_from(["allow", "deny"]),
        "approval_ttl_secs": st.integers(min_value=1, max_value=3600),
        "approval_scope": st.sampled_from(["once", "session"]),
    },
)

policy_documents = st.fixed_dictionaries(
    {
        "name": st.just("prop"),
        "tools": st.lists(rules, max_size=6),
        "defaults": st.fixed_dictionaries({"tool_action": st.sampled_from(ACTIONS)}),
        "autonomy": st.fixed_dictionaries({"on_approval_rule": st.sampled_from(["allow", "deny"])}),
    }
)

commands = st.builds(
    lambda lead, words, trail: lead + " ".join(words) + trail,
    st.sampled_from(["", " ", "  "]),
    st.lists(st.sampled_from(WORDS), min_size=0, max_size=4),
    st.sampled_from(["", " ", "\t"]),
)


@st.composite
def tool_inputs(draw: st.DrawFn) -> dict[str, Any]:
    tool_input: dict[str, Any] = {}
    if draw(st.booleans()):
        tool_input["command"] = draw(commands)
    for key in draw(_sub(list(PATH_KEYS), 2)):
        tool_input[key] = draw(st.sampled_from(PATHS))
    if draw(st.booleans()):
        tool_input["edits"] = [{"file_path": p} for p in draw(_sub(PATHS, 3))]
    return tool_input


calls = st.tuples(st.sampled_from(TOOLS), tool_inputs())


# --- independent oracles -------------------------------------------------------------------------


def _name_hit(pattern: str, tool: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return tool.startswith(pattern[:-1])
    return pattern == tool


def _first_rule(document: dict[str, Any], tool: str) -> int | None:
    for index, rule in enumerate(document["tools"]):
        if any(_name_hit(m, tool) for m in rule["match"]):
            return index
    return None


def _paths_of(tool_input: dict[str, Any]) -> list[str]:
    paths = [tool_input[k] for k in PATH_KEYS if k in tool_input]
    paths += [e["file_path"] for e in tool_input.get("edits", [])]
    return [normalize_path(p) for p in paths]  # the engine judges canonical paths


def _command(tool_input: dict[str, Any]) -> str:
    return str(tool_input.get("command", "")).strip()


def _words(text: str) -> list[str]:
    # shlex's POSIX mode splits and unquotes these generated commands exactly as bash does (they hold no $'...').
    return shlex.split(text)


def _on_boundary(prefix: str, command: str) -> bool:
    """The prefix's words lead the command's words (with one more after them if the prefix ends in a blank)."""
    want, got = _words(prefix), _words(command)
    if not want:
        return not got and not prefix.endswith((" ", "\t"))
    return got[: len(want)] == want and (len(got) > len(want) or not prefix.endswith((" ", "\t")))


# --- properties ----------------------------------------------------------------------------------


@FAST
@given(document=policy_documents)
def test_every_generated_policy_document_parses(document: dict[str, Any]) -> None:
    assert isinstance(parse_policy(document), Policy)


@FAST
@given(document=policy_documents, call=calls, autonomous=st.booleans())
def test_the_verdict_names_the_first_rule_whose_match_hits_the_tool_or_none(
    document: dict[str, Any], call: tuple[str, dict[str, Any]], autonomous: bool
) -> None:
    tool, tool_input = call
    verdict = evaluate(parse_policy(document), tool, tool_input, autonomous=autonomous)
    assert verdict.rule == _first_rule(document, tool)


@FAST
@given(document=policy_documents, call=calls)
def test_a_tool_matching_no_rule_gets_the_default_action(
    document: dict[str, Any], call: tuple[str, dict[str, Any]]
) -> None:
    tool, tool_input = call
    if _first_rule(document, tool) is not None:
        return
    verdict = evaluate(parse_policy(document), tool, tool_input, autonomous=False)
    expected = {"allow": "allow", "deny": "deny", "approve": "require_approval"}[document["defaults"]["tool_action"]]
    assert verdict.action == expected


@FAST
@given(document=policy_documents, call=calls, autonomous=st.booleans())
def test_a_deny_regex_hit_always_denies_whatever_the_allow_prefixes(
    document: dict[str, Any], call: tuple[str, dict[str, Any]], autonomous: bool
) -> None:
    tool, tool_input = call
    index = _first_rule(document, tool)
    if index is None or "shell" not in document["tools"][index]:
        return
    shell = document["tools"][index]["shell"]
    command = _command(tool_input)
    unquoted = " ".join(_words(command))
    if not any(re.search(p, command) or re.search(p, unquoted) for p in shell.get("deny_regex", [])):
        return
    verdict = evaluate(parse_policy(document), tool, tool_input, autonomous=autonomous)
    assert verdict.action == "deny"
    assert verdict.reason is not None and verdict.reason.startswith("shell command matches deny pattern")
    # Even a prefix equal to the whole command cannot rescue it.
    widened = {**document}
    widened["tools"] = [dict(r) for r in document["tools"]]
    widened["tools"][index]["shell"] = {**shell, "allow_prefixes": [command or "x", *PREFIXES]}
    widened["tools"][index]["action"] = "allow"
    assert evaluate(parse_policy(widened), tool, tool_input, autonomous=autonomous).action == "deny"


@FAST
@given(document=policy_documents, call=calls, autonomous=st.booleans())
def test_a_deny_glob_hit_always_denies_on_a_path_rule(
    document: dict[str, Any], call: tuple[str, dict[str, Any]], autonomous: bool
) -> None:
    tool, tool_input = call
    index = _first_rule(document, tool)
    if index is None:
        return
    rule = document["tools"][index]
    if "shell" in rule or "paths" not in rule:
        return  # paths are ignored for shell rules
    deny = rule["paths"].get("deny", [])
    if not any(fnmatchcase(p, g) for p in _paths_of(tool_input) for g in deny):
        return
    verdict = evaluate(parse_policy(document), tool, tool_input, autonomous=autonomous)
    assert verdict.action == "deny"
    assert verdict.reason is not None and "matches deny glob" in verdict.reason


@FAST
@given(document=policy_documents, call=calls)
def test_a_path_outside_every_allow_glob_never_yields_allow_without_autonomy(
    document: dict[str, Any], call: tuple[str, dict[str, Any]]
) -> None:
    tool, tool_input = call
    index = _first_rule(document, tool)
    if index is None:
        return
    rule = document["tools"][index]
    allow = rule.get("paths", {}).get("allow", [])
    if "shell" in rule or not allow:
        return
    paths = _paths_of(tool_input)
    if paths and all(any(fnmatchcase(p, g) for g in allow) for p in paths):
        return
    verdict = evaluate(parse_policy(document), tool, tool_input, autonomous=False)
    assert verdict.action != "allow"


@FAST
@given(document=policy_documents, call=calls)
def test_autonomy_never_turns_a_deny_into_an_allow_and_never_leaves_an_approval_pending(
    document: dict[str, Any], call: tuple[str, dict[str, Any]]
) -> None:
    tool, tool_input = call
    policy = parse_policy(document)
    supervised = evaluate(policy, tool, tool_input, autonomous=False)
    autonomous = evaluate(policy, tool, tool_input, autonomous=True)
    assert autonomous.action != "require_approval"
    assert autonomous.rule == supervised.rule
    if supervised.action == "require_approval":
        assert autonomous.original_action == "require_approval"
    else:
        assert autonomous == supervised  # autonomy touches approvals only
    if supervised.action == "deny":
        assert autonomous.action == "deny"


@FAST
@given(document=policy_documents, call=calls)
def test_a_shell_approval_scope_key_is_the_matched_prefix_or_the_exact_command(
    document: dict[str, Any], call: tuple[str, dict[str, Any]]
) -> None:
    tool, tool_input = call
    index = _first_rule(document, tool)
    verdict = evaluate(parse_policy(document), tool, tool_input, autonomous=False)
    if verdict.action != "require_approval":
        assert verdict.scope_key is None
        return
    if index is None or "shell" not in document["tools"][index]:
        assert verdict.scope_key == tool
        return
    command = _command(tool_input)
    prefixes = document["tools"][index]["shell"].get("allow_prefixes", [])
    matched = next((p for p in prefixes if _on_boundary(p, command)), None)
    if matched is None:
        assert verdict.scope_key == f"{tool}:command:{command}"
    else:
        assert verdict.scope_key == f"{tool}:prefix:{matched}"
        assert _words(command)[: len(_words(matched))] == _words(matched)


JOINABLE_OR_NOT = [*DENY_REGEXES, r"(a)\1", r"(?i)CURL", r"(?P<w>x)(?P=w)", r"(=|\s|$)", r"x|y"]


@FAST
@given(patterns=st.lists(st.sampled_from(JOINABLE_OR_NOT), min_size=1, max_size=5), command=commands)
def test_the_joined_deny_patterns_name_the_same_first_hit_as_trying_each_in_turn(
    patterns: list[str], command: str
) -> None:
    shell = parse_policy({"name": "j", "tools": [{"match": ["Bash"], "action": "allow", "shell": {
        "deny_regex": patterns}}]}).tools[0].shell  # fmt: skip
    assert shell is not None
    expected = next((p for p in patterns if re.search(p, command)), None)
    assert shell.denied_by(command) == expected


# --- governed: whatever it allows, the words bash runs carry no denied flag ----------------------------

GOVERNED = parse_policy(yaml.safe_load((Path(__file__).resolve().parents[2] / "policies/governed.yaml").read_text()))
# How a command may start (governed's toolbox, also spelled with quotes and escapes), and the pieces that may follow:
# the two denied flags in parts, every way of quoting and escaping them, and the expansions that could make them.
LEADS = ["git diff", "git log", "git show", "rg x", "grep x", "ls", "cat", '"git" diff', "g\\it diff", "rg"]
PIECES = [
    "--output=f", "--output", "--pre", "--pre=sh", "--", "-", "=", "o", "ut", "put", "pre", "sh", "x", "f",
    "'", '"', "\\", "$'", '$"', "\\x2d", "\\055", "\\u002d", "{", "}", ",", "..", "*", "?", "[", "]", "!",
    "$IFS", "${IFS}", "$X", "$", "~", "%", "^", " ", " ", "\t",
]  # fmt: skip
governed_commands = st.builds(
    lambda lead, rest: f"{lead} {rest}",
    st.sampled_from(LEADS),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=10).map("".join),
)
TOOLBOX = ("ls", "cat", "head", "tail", "wc", "grep", "rg", "pwd", "git")
# Each toolbox program replaced by a shell function that prints the words it was given, NUL-separated.
STANDINS = "".join(f"{name}() {{ printf '%s\\0' \"$@\"; }}; " for name in TOOLBOX)


def _flag(word: str) -> bool:
    # As git and rg read their arguments: the option, alone or with "=value" (neither takes abbreviations).
    return word.partition("=")[0] in ("--output", "--pre")


@pytest.fixture(scope="module")
def flag_named_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working directory holding files named like the denied flags, for globs to expand to."""
    where = tmp_path_factory.mktemp("flags")
    for name in ("--output=pwned", "--pre=sh", "-x"):
        (where / name).write_text("")
    yield where


def _bash_words(command: str, cwd: Path) -> list[str]:
    done = subprocess.run(
        ["bash", "-c", STANDINS + command],
        cwd=cwd,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8", "X": "--output=f"},
        check=False,
        timeout=10,
    )
    return [w.decode(errors="replace") for w in done.stdout.split(b"\0")[:-1]]


@settings(max_examples=examples(500), deadline=None, database=None)
@given(command=governed_commands)
@example(command="grep 'foo$' notes.txt")
@example(command="git log --format='%h %s' -n 5")
@example(command='git diff "--output=f"')
@example(command="git diff $'\\x2d-output=f'")
@example(command="git diff --{output,x}=f")
@example(command="git diff x$IFS--output=f")
@example(command="git diff *")
@example(command="rg x --pr*")
def test_governed_never_allows_a_command_whose_words_carry_a_denied_flag(command: str, flag_named_files: Path) -> None:
    """The oracle is bash itself: it splits, unquotes and expands the allowed command (globs against a directory
    holding files named ``--output=pwned`` and ``--pre=sh``, ``$X`` set to ``--output=f``), and none of the words
    the toolbox program would get may be ``--output[=…]`` or ``--pre[=…]``."""
    if evaluate(GOVERNED, "Bash", {"command": command}, autonomous=False).action != "allow":
        return
    words = _bash_words(command, flag_named_files)
    assert not [w for w in words if _flag(w)], (command, words)


# --- budgets only tighten ------------------------------------------------------------------------

budgets = st.builds(
    Budgets,
    max_wall_clock_secs=st.none() | st.integers(min_value=1, max_value=100_000),
    max_tokens=st.none() | st.integers(min_value=0, max_value=10_000_000),
    max_cost_usd=st.none() | st.floats(min_value=0, max_value=1000, allow_nan=False, allow_infinity=False),
    max_tool_calls=st.none() | st.integers(min_value=0, max_value=1000),
)


@FAST
@given(layers=st.lists(st.none() | budgets, min_size=0, max_size=4))
def test_intersected_budgets_only_tighten(layers: list[Budgets | None]) -> None:
    result = intersect_budgets(*layers)
    present = [b for b in layers if b is not None]
    for field in Budgets.model_fields:
        caps = [getattr(b, field) for b in present if getattr(b, field) is not None]
        got = getattr(result, field)
        if not caps:
            assert got is None
        else:
            assert got is not None
            assert all(got <= cap for cap in caps)
            assert got in caps  # never invents a cap


@FAST
@given(a=budgets, b=budgets)
def test_intersecting_budgets_is_commutative_and_idempotent(a: Budgets, b: Budgets) -> None:
    assert intersect_budgets(a, b) == intersect_budgets(b, a)
    assert intersect_budgets(a, a) == a
