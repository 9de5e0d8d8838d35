"""Replay script parsing and validation, and the shape of the baked default transcript."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner import replay
from runner.replay import ScriptError, load_script, parse_script

TRANSCRIPT_FILE = Path(replay.__file__).parent / "transcripts" / "demo.json"


def test_a_valid_script_parses_into_steps() -> None:
    steps = parse_script(
        json.dumps(
            [
                {"say": "hi"},
                {"sleep_ms": 0},
                {"tool": "Bash", "input": {"command": "true"}, "timeout_ms": 1000, "on_deny_say": "ok"},
                {"tool": "Write", "input": {"file_path": "a", "content": ""}},
                {"tool": "Edit", "input": {"file_path": "a", "old_string": "x", "new_string": ""}},
                {"tool": "Read", "input": {"file_path": "a"}},
            ]
        )
    )
    assert [step.kind() for step in steps] == ["say", "sleep_ms", "tool", "tool", "tool", "tool"]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("not json", "not JSON"),
        ('{"say": "hi"}', "expected a JSON array"),
        ("[]", "no steps"),
        ('[{"say": "hi"}, "text"]', "step 2"),
        ('[{"say": "hi", "sleep_ms": 5}]', "exactly one of say, tool, sleep_ms"),
        ("[{}]", "exactly one of say, tool, sleep_ms"),
        ('[{"tool": "Glob", "input": {}}]', "step 1: tool"),
        ('[{"say": "hi", "colour": "red"}]', "colour"),
        ('[{"sleep_ms": -1}]', "sleep_ms"),
        ('[{"tool": "Bash", "input": {"command": "ls"}, "timeout_ms": 0}]', "timeout_ms"),
        ('[{"tool": "Bash"}]', "Bash needs a string input.command"),
        ('[{"tool": "Bash", "input": {"command": 7}}]', "Bash needs a string input.command"),
        ('[{"tool": "Edit", "input": {"file_path": "a", "old_string": "x"}}]', "input.new_string"),
        ('[{"say": "hi", "input": {"command": "ls"}}]', "input only applies to tool steps"),
        ('[{"say": "hi", "on_deny_say": "no"}]', "on_deny_say only applies to tool steps"),
    ],
)
def test_invalid_scripts_are_rejected_with_the_step_named(script: str, message: str) -> None:
    with pytest.raises(ScriptError, match="invalid replay script") as excinfo:
        parse_script(script)
    assert message in str(excinfo.value)


def test_the_script_comes_from_the_environment_when_set() -> None:
    steps = load_script({"FLUIDBOX_REPLAY_SCRIPT": '[{"say": "custom"}]'})
    assert [step.say for step in steps] == ["custom"]


@pytest.mark.parametrize("environ", [{}, {"FLUIDBOX_REPLAY_SCRIPT": "  "}])
def test_the_default_transcript_is_used_when_no_script_is_set(environ: dict[str, str]) -> None:
    assert load_script(environ) == parse_script(TRANSCRIPT_FILE.read_text())


def test_the_default_transcript_is_the_baked_file() -> None:
    assert json.loads(replay.DEFAULT_TRANSCRIPT) == json.loads(TRANSCRIPT_FILE.read_text())


def test_the_default_transcript_follows_the_demo_storyline() -> None:
    steps = parse_script(replay.DEFAULT_TRANSCRIPT)
    kinds = "say tool say tool tool say tool tool say".split()
    assert [step.kind() for step in steps] == kinds
    tool_steps = [(step.tool, step.input) for step in steps if step.tool]
    assert tool_steps == [
        ("Bash", {"command": "./run_tests.sh"}),
        (
            "Edit",
            {
                "file_path": "/workspace/app.py",
                "old_string": '"Hello, name!"',
                "new_string": 'f"Hello, {name}!"',
            },
        ),
        ("Bash", {"command": "./run_tests.sh"}),
        ("Bash", {"command": "curl -s https://status.demo.internal/health"}),
        ("Bash", {"command": "./deploy.sh"}),
    ]
    curl = next(step for step in steps if step.input and "curl" in step.input.get("command", ""))
    assert curl.on_deny_say and "policy" in curl.on_deny_say
