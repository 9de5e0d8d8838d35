"""The runner's pydantic-free replay-step rules agree with the API's model of a step."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.contract import ReplayStep
from core.wire import step_problems, to_step

CASES: list[Any] = [
    {"say": "hi"},
    {"sleep_ms": 0},
    {"sleep_ms": 3_600_000},
    {"sleep_ms": 3_600_001},
    {"sleep_ms": -1},
    {"sleep_ms": 1.5},
    {"sleep_ms": "5"},
    {"sleep_ms": True},
    {"tool": "Bash", "input": {"command": "true"}, "timeout_ms": 1000, "on_deny_say": "ok"},
    {"tool": "Bash", "input": {"command": "true"}, "timeout_ms": 0},
    {"tool": "Bash", "input": {"command": "true"}, "timeout_ms": 600_001},
    {"tool": "Glob", "input": {}},
    {"tool": "mcp__files__read", "input": {"path": "a"}},
    {"tool": "mcp__Files__read"},
    {"tool": 7},
    {"tool": "Read", "input": "a"},
    {"say": 3},
    {"say": "hi", "colour": "red"},
    {"on_deny_say": ["no"]},
    "text",
    ["say"],
    None,
]


def model_accepts(item: Any) -> bool:
    try:
        ReplayStep.model_validate(item, strict=True)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("item", CASES)
def test_the_runner_and_the_api_accept_the_same_steps(item: Any) -> None:
    assert (step_problems(item) == []) == model_accepts(item)


def test_an_accepted_step_reads_the_same_on_both_sides() -> None:
    item = {"tool": "Bash", "input": {"command": "true"}, "timeout_ms": 1000, "on_deny_say": "ok"}
    step, model = to_step(item), ReplayStep.model_validate(item)
    assert (step.kind(), step.tool, step.input, step.timeout_ms, step.on_deny_say) == (
        model.kind(),
        model.tool,
        model.input,
        model.timeout_ms,
        model.on_deny_say,
    )
