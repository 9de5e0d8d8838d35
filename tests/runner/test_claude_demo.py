"""`fluidbox demo` picks the Claude harness when a model upstream is configured, and runs it end to end.

The upstream is the scripted one (tests/llm_upstream.py) playing a realistic fix of the demo repository:
the real CLI in the real sandbox reads, edits and tests, and the deploy waits for the approval the demo
gives over HTTP.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.client import CliError
from cli.main import ANTHROPIC_UPSTREAM, demo_harness
from cli.stack import free_port
from tests.llm_upstream import Upstream, running_upstream, text, tool_use

FLUIDBOX = str(Path(sys.executable).parent / "fluidbox")


def test_the_demo_runs_claude_only_when_a_model_upstream_is_configured() -> None:
    assert demo_harness({})[0] == "replay"
    harness, extra, says = demo_harness({"ANTHROPIC_API_KEY": "sk-ant-x"})
    assert (harness, extra) == ("claude-agent-sdk", {"FLUIDBOX_LLM_UPSTREAM_URL": ANTHROPIC_UPSTREAM})
    assert says.startswith("harness: claude-agent-sdk")
    harness, extra, says = demo_harness(
        {"FLUIDBOX_LLM_UPSTREAM_URL": "http://127.0.0.1:9/", "FLUIDBOX_LLM_UPSTREAM_KEY": "k"}
    )
    assert (harness, extra) == ("claude-agent-sdk", {}) and "http://127.0.0.1:9/" in says
    with pytest.raises(CliError, match="no key to call it with"):
        demo_harness({"FLUIDBOX_LLM_UPSTREAM_URL": "http://127.0.0.1:9/"})


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fbxcd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with running_upstream() as up:
        yield up


@pytest.mark.stack
def test_the_claude_demo_fixes_the_repository_through_the_gate(home: Path, upstream: Upstream) -> None:
    upstream.push(
        tool_use("Bash", {"command": "./run_tests.sh", "description": "run the tests"}),
        tool_use("Read", {"file_path": "/workspace/app.py"}),
        tool_use(
            "Edit",
            {"file_path": "/workspace/app.py", "old_string": '"Hello, name!"', "new_string": 'f"Hello, {name}!"'},
        ),
        tool_use("Bash", {"command": "./run_tests.sh", "description": "run the tests again"}),
        tool_use("Bash", {"command": "./deploy.sh", "description": "deploy"}),
        text("Fixed greet() to use its argument; the tests pass and the deploy ran."),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLUIDBOX_", "ANTHROPIC_"))}
    env.update(
        FLUIDBOX_HOME=str(home),
        FLUIDBOX_BIND=f"127.0.0.1:{free_port()}",
        FLUIDBOX_TEMPORAL_PORT=str(free_port()),
        FLUIDBOX_UI_PORT=str(free_port()),
        FLUIDBOX_LLM_UPSTREAM_URL=upstream.url,
        FLUIDBOX_LLM_UPSTREAM_KEY="sk-demo-upstream-key",
    )
    proc = subprocess.run([FLUIDBOX, "demo"], env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"harness: claude-agent-sdk (a real Claude agent; model traffic → {upstream.url})" in out
    assert "needs a human: Bash: ./deploy.sh" in out and "a human approves over HTTP" in out
    assert '+    return f"Hello, {name}!"' in out and "deploy.log" in out
    assert "__pycache__" not in out, "the agent's shells write no bytecode into the workspace"
    assert "result completed: Fixed greet() to use its argument" in out
    assert "── run completed ──" in out
    # Every model request went through the facade with the real key, none with a run token.
    assert {r.headers.get("x-api-key") for r in upstream.requests if r.path == "/v1/messages"} == {
        "sk-demo-upstream-key"
    }
