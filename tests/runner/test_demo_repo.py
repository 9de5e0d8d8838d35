"""The default transcript really fixes examples/demo-repo when its tool steps are executed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner import tools
from runner.replay import DEFAULT_TRANSCRIPT, execute, parse_script

DEMO_REPO = Path(__file__).resolve().parents[2] / "examples" / "demo-repo"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    shutil.copytree(DEMO_REPO, root)
    return root


def test_the_demo_repo_starts_broken(workspace: Path) -> None:
    code, output = tools.run_bash("./run_tests.sh", workspace)
    assert code == 1
    assert "'Hello, name!'" in output
    assert "expected 'Hello, Ada!'" in output


def test_the_transcript_tool_steps_turn_failing_tests_into_passing(workspace: Path) -> None:
    test_results: list[int] = []
    for step in parse_script(DEFAULT_TRANSCRIPT):
        if step.tool is None or step.input is None:
            continue
        command = step.input.get("command", "")
        if "curl" in command:
            continue  # denied by the demo policy; there is no network to reach anyway
        if command == "./run_tests.sh":
            code, _ = tools.run_bash(command, workspace)
            test_results.append(code)
        else:
            execute(step.tool, step.input, str(workspace), 60)
    assert test_results == [1, 0]
    assert 'return f"Hello, {name}!"' in (workspace / "app.py").read_text()
    assert (workspace / "deploy.log").read_text().startswith("deployed ")
    assert not (workspace / "__pycache__").exists()


def test_deploy_appends_a_line_each_time(workspace: Path) -> None:
    assert tools.run_bash("./deploy.sh", workspace) == (0, "deployed\n")
    assert tools.run_bash("./deploy.sh", workspace) == (0, "deployed\n")
    lines = (workspace / "deploy.log").read_text().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("deployed ") for line in lines)


def test_the_demo_scripts_are_executable() -> None:
    for name in ("run_tests.sh", "deploy.sh"):
        assert (DEMO_REPO / name).stat().st_mode & 0o111, name
