"""Canonical tool vocabulary: runners translate native names and shapes before asking the gate."""

from __future__ import annotations

import pytest

from core.tools import CANONICAL, GROUP_OF, NESTING, canonicalize, split_mcp


@pytest.mark.parametrize(
    ("native", "given", "expected"),
    [
        ("shell", {"cmd": "ls"}, ("Bash", {"command": "ls"})),
        ("exec", {"argv": ["git", "status"]}, ("Bash", {"command": "git status"})),
        ("Bash", {"command": "ls"}, ("Bash", {"command": "ls"})),
        ("read_file", {"path": "a.py"}, ("Read", {"file_path": "a.py"})),
        ("edit_file", {"filePath": "a.py", "old_string": "x"}, ("Edit", {"file_path": "a.py", "old_string": "x"})),
        ("Write", {"file_path": "a", "content": ""}, ("Write", {"file_path": "a", "content": ""})),
        ("mcp__linear__create_issue", {"title": "t"}, ("mcp__linear__create_issue", {"title": "t"})),
    ],
)
def test_native_calls_become_canonical(
    native: str, given: dict[str, object], expected: tuple[str, dict[str, object]]
) -> None:
    assert canonicalize(native, given) == expected


def test_canonicalize_never_mutates_its_input() -> None:
    given = {"cmd": "ls"}
    canonicalize("shell", given)
    assert given == {"cmd": "ls"}


def test_mcp_names_split_on_the_first_double_underscore() -> None:
    assert split_mcp("mcp__sentry__list__issues") == ("sentry", "list__issues")
    assert split_mcp("mcp__x") is None and split_mcp("Bash") is None and split_mcp("mcp____t") is None


def test_every_canonical_tool_has_exactly_one_group_and_nesting_tools_are_canonical() -> None:
    assert len(CANONICAL) == len(set(CANONICAL)) == len(GROUP_OF)
    assert NESTING <= set(CANONICAL)
