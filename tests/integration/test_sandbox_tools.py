"""Tools that run inside the sandbox and still answer to the gate: sandbox-class capability servers (a real
stdio MCP server launched in a real bubblewrap sandbox with no network) and sandbox CLI tools (``git`` and
``printf`` of the sandbox image, no shell)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cli.stack import Stack
from tests.integration.helpers import (
    ROOT,
    events,
    issue_token,
    make_agent,
    make_policy,
    start_run,
    unique,
    wait_status,
)

pytestmark = pytest.mark.stack

SANDBOX_POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [{"match": ["mcp__*"], "action": "allow"}],
}
PROBE_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "port": {"type": "integer"}},
    "required": ["text", "port"],
    "additionalProperties": False,
}


def said(evs: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]


def decisions(evs: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    return [e["payload"]["data"] for e in evs if e["type"] == "tool.decision" and e["payload"]["data"]["tool"] == tool]


async def test_a_sandbox_class_server_runs_inside_the_sandbox_with_no_network(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    (workspace / ".mcp").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "mcp_stdio_server.py", workspace / ".mcp" / "server.py")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the port is reachable from the host: "unreachable" below is the sandbox's doing
        name = unique("probe").replace("-", "_")
        bundle = {
            "name": name,
            "servers": [
                {
                    "class": "sandbox",
                    "name": "probe",
                    "command": sys.executable,
                    "args": ["/workspace/.mcp/server.py"],
                    "tools": [{"name": "probe", "description": "what the server sees", "input_schema": PROBE_SCHEMA}],
                }
            ],
        }
        r = await api.post("/v1/capabilities", json=bundle)
        assert r.status_code == 200, r.text
        script = [
            {"tool": "mcp__probe__probe", "input": {"text": "hello", "port": port}},
            {"tool": "mcp__probe__probe", "input": {"text": "x", "port": "not a port"}},
        ]
        agent = await make_agent(api, script, policy=await make_policy(api, SANDBOX_POLICY), capability_bundles=[name])
        run_id = await start_run(api, agent, workspace=workspace)
        row = await wait_status(api, run_id, {"completed", "failed"})
    evs = await events(api, run_id)
    assert row["result_summary"] == "Replay complete: 1 executed, 1 denied.", said(evs)
    assert "mcp__probe__probe → cwd=/workspace network=unreachable tokens=none text=hello" in said(evs)
    verdicts = [(d["verdict"], d["source"]) for d in decisions(evs, "mcp__probe__probe")]
    assert verdicts == [("allow", "policy"), ("deny", "schema")], "each call is judged with the frozen schema"
    assert not [e for e in evs if e["type"] == "tool.brokered"], "nothing went through the broker"


async def test_the_shipped_workspace_info_entry_connects_and_answers_from_inside_a_sandbox(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The catalog seeds ``workspace-info`` (an in-image stdio server): connecting it publishes a bundle, and a
    run pinning the bundle calls its ``summary`` tool, started by the runner inside the sandbox."""
    r = await api.post("/v1/catalog/workspace-info/connect", json={})
    assert r.status_code == 200, r.text
    bundle = r.json()["bundle"]["name"]
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "main.py").write_text("print('hi')\n")
    (workspace / "notes.md").write_text("# notes\n")
    script = [{"tool": "mcp__workspace-info__summary", "input": {}}]
    agent = await make_agent(api, script, policy=await make_policy(api, SANDBOX_POLICY), capability_bundles=[bundle])
    run_id = await start_run(api, agent, workspace=workspace)
    row = await wait_status(api, run_id, {"completed", "failed"})
    evs = await events(api, run_id)
    assert row["result_summary"] == "Replay complete: 1 executed, 0 denied.", said(evs)
    answer = next(t for t in said(evs) if t.startswith("mcp__workspace-info__summary → "))
    assert '"Python": {"files": 1, "bytes": 12}' in answer and '"Markdown": {"files": 1, "bytes": 8}' in answer


def git_repo(path: Path) -> Path:
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": "/dev/null"}  # fmt: skip
    for args in (["init", "-q"], ["checkout", "-q", "-b", "main"]):
        subprocess.run(["git", *args], cwd=path, check=True, env=env)
    for file, message in (("a.txt", "first: add a"), ("b.txt", "second: add b")):
        (path / file).write_text(message)
        subprocess.run(["git", "add", file], cwd=path, check=True, env=env)
        subprocess.run(["git", "commit", "-q", "-m", message], cwd=path, check=True, env=env)
    return path


CLI_TOOLS: list[dict[str, Any]] = [
    {
        "name": "git_log",
        "description": "Commit subjects, newest first",
        "command": "git",
        "args": ["-c", "safe.directory=*", "log", "--format=%s", "--max-count", "{count}", "--", "{path}"],
        "input_schema": {
            "type": "object",
            "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 50}, "path": {"type": "string"}},
            "required": ["count"],
            "additionalProperties": False,
        },
    },
    {
        "name": "echo_args",
        "description": "Print each argument in brackets",
        "command": "printf",
        "args": ["[%s]\\n", "{text}"],
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
]


async def test_a_sandbox_cli_tool_runs_git_in_the_sandbox_with_each_argument_literal(
    api: httpx.AsyncClient, stack: Stack, tmp_path: Path
) -> None:
    name = unique("git")
    created = await api.post(
        "/v1/connections",
        json={
            "provider": "sandbox_cli",
            "base_url": f"sandbox-cli://{name}",
            "tools": CLI_TOOLS,
            "access": {"read": True},
        },
    )
    assert created.status_code == 200, created.text
    connection = created.json()["connection"]
    assert (connection["transport"], connection["status"]) == ("sandbox_cli", "active")
    assert [t["name"] for t in created.json()["snapshot"]["tools"]] == ["git_log", "echo_args"]
    script = [
        {"tool": "mcp__git__git_log", "input": {"count": 5}},
        {"tool": "mcp__git__echo_args", "input": {"text": "; rm -rf /"}},
        {"tool": "mcp__git__echo_args", "input": {"text": "--version"}},
        {"tool": "mcp__git__git_log", "input": {"count": "5; rm -rf /"}},
        {"sleep_ms": 600000},
    ]
    agent = await make_agent(
        api, script, policy=await make_policy(api, SANDBOX_POLICY),
        connection_requirements=[
            {"slot": "git", "connector": {"url": f"sandbox-cli://{name}"}, "required_tools": ["git_log", "echo_args"]}
        ],
    )  # fmt: skip
    run_id = await start_run(api, agent, workspace=git_repo(tmp_path / "repo"))

    async def narrated() -> list[str] | None:
        texts = said(await events(api, run_id))
        return texts if len([t for t in texts if t.startswith("mcp__git__")]) >= 4 else None

    from tests.helpers import eventually

    texts = await eventually(narrated, timeout=60, message="the four sandbox CLI calls were not narrated")
    assert "mcp__git__git_log → second: add b\nfirst: add a" in texts
    assert "mcp__git__echo_args → [; rm -rf /]" in texts, "one literal argument, no shell"
    assert (
        "mcp__git__echo_args → error: argument 'text' may not start with '-' (it would be read as an option)" in texts
    )
    assert any(t.startswith("mcp__git__git_log denied: arguments rejected by frozen schema: /count") for t in texts)
    # The broker never executes a sandbox CLI tool.
    token = await issue_token(stack.database_url or "", run_id, "tool")
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}) as runner:
        r = await runner.post(
            f"/internal/sessions/{run_id}/tools/call",
            json={"tool_call_id": "b1", "tool": "mcp__git__git_log", "input": {"count": 1}},
        )
        assert r.status_code == 400 and "is a sandbox CLI tool" in r.json()["error"]
    evs = await events(api, run_id)
    assert not [e for e in evs if e["type"] == "tool.brokered"]
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([{**CLI_TOOLS[0], "command": "git log"}], "one program name or absolute path"),
        ([{**CLI_TOOLS[1], "args": ["x{text}"]}], "a placeholder is a whole argument"),
        ([{**CLI_TOOLS[1], "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}],
         "additionalProperties: false"),
        ([{**CLI_TOOLS[1], "args": []}], "must be exactly the template's placeholders"),
        ([{**CLI_TOOLS[1], "input_schema": {**CLI_TOOLS[1]["input_schema"], "properties": {"text": {"type": "array"}}}}],  # noqa: E501
         "must have a scalar type"),
    ],
)  # fmt: skip
async def test_bad_sandbox_cli_declarations_are_refused_and_store_nothing(
    api: httpx.AsyncClient, tools: list[dict[str, Any]], message: str
) -> None:
    url = f"sandbox-cli://{unique('bad')}"
    r = await api.post("/v1/connections", json={"provider": "sandbox_cli", "base_url": url, "tools": tools})
    assert r.status_code == 400 and message in r.json()["error"], r.text
    token = await api.post(
        "/v1/connections",
        json={"provider": "sandbox_cli", "base_url": url, "tools": CLI_TOOLS, "token": "never-in-a-sandbox"},
    )
    assert token.status_code == 400 and "takes no `token`" in token.json()["error"]
    listed = (await api.get("/v1/connections")).json()["connections"]
    assert not [c for c in listed if c["base_url"] == url]


# ---- git as a CLI tool runs nothing the workspace names (issue 24, finding 10) ----------------------------------

HOOKS = ("post-index-change", "pre-commit", "commit-msg", "prepare-commit-msg", "post-commit", "pre-auto-gc")
# What the agent writes (a policy that lets it write files but denies Bash): every way its repository's
# configuration, what that includes, and its home's ~/.gitconfig can make git start a command on a status, a diff,
# a log, a show, an add or a commit. Each command would leave /workspace/pwned-<what> (no bare ';' in the
# values: it starts a comment in git's configuration syntax).
PLANTED_CONFIG = """[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
\tfsmonitor = "touch /workspace/pwned-fsmonitor; false"
\thooksPath = /workspace/.hooks
\tpager = touch /workspace/pwned-core-pager
\teditor = touch /workspace/pwned-editor
[pager]
\tstatus = touch /workspace/pwned-pager-status
\tlog = touch /workspace/pwned-pager-log
[filter "lfs"]
\tclean = sh -c 'touch /workspace/pwned-clean && cat'
\tsmudge = sh -c 'touch /workspace/pwned-smudge && cat'
\trequired = true
[diff "pretty"]
\ttextconv = sh -c 'touch /workspace/pwned-textconv && cat $0'
\tcommand = touch /workspace/pwned-diff-command
[diff]
\texternal = touch /workspace/pwned-diff-external
[log]
\tshowSignature = true
[commit]
\tgpgSign = true
[gpg]
\tprogram = /workspace/.hooks/gpg
[include]
\tpath = /workspace/extra.gitconfig
"""
PLANTED_INCLUDE = "[filter \"included\"]\n\tprocess = sh -c 'touch /workspace/pwned-process && cat'\n"
PLANTED_HOME = (
    "[filter \"home\"]\n\tclean = sh -c 'touch /workspace/pwned-home && cat'\n"
    "[core]\n\tpager = touch /workspace/pwned-home-pager\n"
)
PLANTED_ATTRIBUTES = "*.txt filter=lfs diff=pretty\n*.md filter=included\n*.cfg filter=home\n"


def catalog_git_tools() -> list[dict[str, Any]]:
    """The shipped ``git`` entry's six tools, exactly as the catalog declares them."""
    entries = yaml.safe_load((ROOT / "catalog" / "connectors.yaml").read_text())
    return list(next(e for e in entries if e.get("slug") == "git")["transport_config"]["tools"])


async def test_the_git_cli_tools_run_no_command_the_agents_git_configuration_names(
    api: httpx.AsyncClient, stack: Stack, tmp_path: Path
) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "notes.md").write_text("notes\n")
    (repo / "settings.cfg").write_text("x = 1\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": "/dev/null"}  # fmt: skip
    subprocess.run(["git", "add", "notes.md", "settings.cfg"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "third: notes and settings"], cwd=repo, check=True, env=env)
    hooks = repo / ".hooks"  # executable scripts the repository ships: the agent's config points git at them
    hooks.mkdir()
    for hook in (*HOOKS, "gpg"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch /workspace/pwned-hook-{hook}\n")
        (hooks / hook).chmod(0o755)
    name = unique("git")
    created = await api.post(
        "/v1/connections",
        json={
            "provider": "sandbox_cli",
            "base_url": f"sandbox-cli://{name}",
            "tools": catalog_git_tools(),
            "access": {"read": True},
        },
    )
    assert created.status_code == 200, created.text
    script: list[dict[str, Any]] = [
        {"tool": "Bash", "input": {"command": "touch /workspace/pwned-bash"}},
        {"tool": "Write", "input": {"file_path": "/workspace/.git/config", "content": PLANTED_CONFIG}},
        {"tool": "Write", "input": {"file_path": "/workspace/extra.gitconfig", "content": PLANTED_INCLUDE}},
        {"tool": "Write", "input": {"file_path": "/workspace/.gitconfig", "content": PLANTED_HOME}},
        {"tool": "Write", "input": {"file_path": "/workspace/.gitattributes", "content": PLANTED_ATTRIBUTES}},
        {"tool": "Write", "input": {"file_path": "/workspace/a.txt", "content": "changed by the agent\n"}},
        {"tool": "Write", "input": {"file_path": "/workspace/notes.md", "content": "more notes\n"}},
        {"tool": "Write", "input": {"file_path": "/workspace/settings.cfg", "content": "x = 2\n"}},
        {"tool": "mcp__git__git_status", "input": {}},
        {"tool": "mcp__git__git_diff", "input": {}},
        {"tool": "mcp__git__git_log", "input": {"count": 5}},
        {"tool": "mcp__git__git_show", "input": {"rev": "HEAD"}},
        {"tool": "mcp__git__git_add", "input": {"path": "a.txt"}},
        {"tool": "mcp__git__git_commit", "input": {"message": "agent commit"}},
        {"tool": "mcp__git__git_log", "input": {"count": 5}},
    ]
    tools = [t["name"] for t in catalog_git_tools()]
    policy = {
        "defaults": {"tool_action": "deny"},
        "tools": [{"match": ["mcp__*"], "action": "allow"}, {"match": ["Write"], "action": "allow"}],
    }
    agent = await make_agent(
        api, script, policy=await make_policy(api, policy),
        connection_requirements=[
            {"slot": "git", "connector": {"url": f"sandbox-cli://{name}"}, "required_tools": tools}
        ],
    )  # fmt: skip
    run_id = await start_run(api, agent, workspace=repo)
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
    evs = await events(api, run_id)
    texts = said(evs)
    workspace = stack.home / "runs" / run_id / "workspace"
    assert (workspace / ".git" / "config").read_text() == PLANTED_CONFIG, "the agent's configuration was in place"
    ran = sorted(p.name for p in workspace.iterdir() if p.name.startswith("pwned-"))
    assert ran == [], f"git ran commands the workspace named: {ran}"
    # And git still did its work: every call answered, the commit landed.
    assert row["result_summary"] == "Replay complete: 14 executed, 1 denied.", texts
    outputs = {t.split(" → ", 1)[0]: t for t in texts if t.startswith("mcp__git__")}
    assert "M a.txt" in outputs["mcp__git__git_status"], outputs
    assert "+changed by the agent" in outputs["mcp__git__git_diff"], outputs
    assert "agent commit" in outputs["mcp__git__git_log"] and "third: notes" in outputs["mcp__git__git_log"], outputs
    await api.post(f"/v1/sessions/{run_id}/cancel")
