"""The replay driver's bookkeeping against a recording stand-in for the gateway (no HTTP involved).

The wire format is covered end to end against the real API elsewhere; here only the harness logic:
tool-call numbering, allow/deny narration, updated_input, the summary, failure reporting, quiesce.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from core.contract import PermissionResponse
from runner import harness, replay
from runner.heartbeat import Heartbeat


class Recorder:
    def __init__(self, decisions: dict[str, PermissionResponse] | None = None, action: str | None = None) -> None:
        self.decisions = decisions or {}
        self.action = action
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.asked: list[tuple[str, str, dict[str, Any]]] = []
        self.results: list[tuple[str, str]] = []
        self.heartbeats = threading.Event()

    def emit(self, actor: str, type: str, data: dict[str, Any]) -> None:
        self.events.append((actor, type, data))

    def heartbeat(self) -> str | None:
        self.heartbeats.set()
        return self.action

    def permission(self, tool_call_id: str, tool: str, input: dict[str, Any]) -> PermissionResponse:
        self.asked.append((tool_call_id, tool, input))
        return self.decisions.get(tool_call_id, PermissionResponse(decision="allow"))

    def result(self, outcome: str, summary: str) -> None:
        self.results.append((outcome, summary))

    def texts(self) -> list[str]:
        return [data["text"] for _, type_, data in self.events if type_ == "agent.message"]


def env(workspace: Path, script: list[dict[str, Any]] | None = None) -> dict[str, str]:
    environ = {
        "FLUIDBOX_WORKSPACE": str(workspace),
        "FLUIDBOX_REPLAY_DELAY_MS": "0",
        "FLUIDBOX_HEARTBEAT_SECS": "3600",
        "FLUIDBOX_AUTONOMY": "supervised",
    }
    if script is not None:
        environ["FLUIDBOX_REPLAY_SCRIPT"] = json.dumps(script)
    return environ


def test_tool_calls_are_numbered_over_tool_steps_and_denials_are_narrated(tmp_path: Path) -> None:
    script = [
        {"say": "hello"},
        {"tool": "Write", "input": {"file_path": "/workspace/a.txt", "content": "one"}},
        {"sleep_ms": 0},
        {"tool": "Bash", "input": {"command": "./deploy.sh"}},
        {"tool": "Bash", "input": {"command": "rm -rf x"}, "on_deny_say": "fine, I won't"},
        {"tool": "Bash", "input": {"command": "cat a.txt; exit 2"}},
    ]
    gw = Recorder(
        {
            "rp_002": PermissionResponse(decision="deny", message="needs approval"),
            "rp_003": PermissionResponse(decision="deny", message="nope"),
        }
    )
    assert replay.run(gw, env(tmp_path, script), exit_process=pytest.fail) == 0
    assert [call[0] for call in gw.asked] == ["rp_001", "rp_002", "rp_003", "rp_004"]
    assert gw.events[0] == (
        "harness",
        "agent.message",
        {
            "role": "system",
            "text": "deterministic replay runner starting — scripted transcript, no model calls (autonomy=supervised)",
        },
    )
    assert gw.texts()[1:] == [
        "hello",
        "wrote /workspace/a.txt (3 bytes)",
        "Bash denied: needs approval",
        "fine, I won't",
        "$ cat a.txt; exit 2\none\n→ exit 2",
    ]
    assert all(actor == "agent" for actor, _, _ in gw.events[1:])
    assert gw.results == [
        ("completed", "Replay complete: 2 executed, 2 denied. Deploy withheld — nothing was released.")
    ]


def test_updated_input_from_the_gate_is_what_runs(tmp_path: Path) -> None:
    script = [{"tool": "Bash", "input": {"command": "echo original"}}]
    gw = Recorder({"rp_001": PermissionResponse(decision="allow", updated_input={"command": "echo rewritten"})})
    assert replay.run(gw, env(tmp_path, script), exit_process=pytest.fail) == 0
    assert gw.texts()[-1] == "$ echo rewritten\nrewritten"
    assert gw.results == [("completed", "Replay complete: 1 executed, 0 denied.")]


def test_a_bad_script_fails_the_run_with_run_error(tmp_path: Path) -> None:
    gw = Recorder()
    environ = env(tmp_path)
    environ["FLUIDBOX_REPLAY_SCRIPT"] = "[]"
    assert replay.run(gw, environ, exit_process=pytest.fail) == 1
    assert gw.events[-1] == (
        "harness",
        "run.error",
        {"message": "replay runner failed: invalid replay script: no steps"},
    )
    assert gw.results == [("failed", "replay runner failed: invalid replay script: no steps")]


def test_a_failing_tool_step_fails_the_run(tmp_path: Path) -> None:
    script = [{"tool": "Edit", "input": {"file_path": "missing.py", "old_string": "a", "new_string": "b"}}]
    gw = Recorder()
    assert replay.run(gw, env(tmp_path, script), exit_process=pytest.fail) == 1
    outcome, summary = gw.results[0]
    assert outcome == "failed"
    assert summary.startswith("replay runner failed: ")
    assert "missing.py" in summary


def test_quiesce_ends_the_process_with_0_and_no_result() -> None:
    gw = Recorder(action="quiesce")
    exits: list[int] = []
    done = threading.Event()

    def exit_process(code: int) -> None:
        exits.append(code)
        done.set()

    beat = Heartbeat(gw, 3600, on_quiesce=lambda: exit_process(0), on_fatal=exit_process)
    beat.start()
    assert done.wait(5)
    beat.join(5)
    assert exits == [0]
    assert gw.results == []


def test_missing_environment_exits_2_and_still_scrubs_tokens() -> None:
    environ = {"FLUIDBOX_SESSION_TOKEN": "tok", "FLUIDBOX_TOOL_TOKEN": "tool", "ANTHROPIC_API_KEY": "k"}
    assert harness.main(environ) == 2
    assert environ == {}
    environ = {"FLUIDBOX_SESSION_ID": "s", "FLUIDBOX_LLM_TOKEN": "llm"}
    assert harness.main(environ) == 2
    assert environ == {"FLUIDBOX_SESSION_ID": "s"}
