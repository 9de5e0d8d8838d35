"""The claude-agent-sdk harness mounts in-sandbox tools: a sandbox-class capability server (a real stdio MCP
server the Claude Code CLI launches inside the bubblewrap sandbox, no network) and a sandbox CLI tool, each
call decided by the gate with its frozen schema first."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.helpers import (
    ROOT,
    events,
    make_agent,
    make_policy,
    start_run,
    unique,
    wait_pending,
    wait_status,
)
from tests.integration.test_claude_e2e import MODEL, POLICY, messages_requests, of_type, result_text, tool_results
from tests.integration.test_sandbox_tools import CLI_TOOLS, PROBE_SCHEMA
from tests.llm_upstream import Upstream, text, tool_use

pytestmark = pytest.mark.stack


async def test_claude_runs_sandbox_class_servers_and_sandbox_cli_tools_behind_the_gate(
    api: httpx.AsyncClient, llm_upstream: Upstream, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    (workspace / ".mcp").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "mcp_stdio_server.py", workspace / ".mcp" / "server.py")
    bundle = unique("probe").replace("-", "_")
    server: dict[str, Any] = {
        "class": "sandbox", "name": "probe", "command": sys.executable, "args": ["/workspace/.mcp/server.py"],
        "tools": [{"name": "probe", "description": "what the server sees", "input_schema": PROBE_SCHEMA}],
    }  # fmt: skip
    assert (await api.post("/v1/capabilities", json={"name": bundle, "servers": [server]})).status_code == 200
    cli = unique("cli")
    r = await api.post(
        "/v1/connections",
        json={
            "provider": "sandbox_cli",
            "base_url": f"sandbox-cli://{cli}",
            "tools": CLI_TOOLS,
            "access": {"read": True},
        },
    )
    assert r.status_code == 200, r.text
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        llm_upstream.push(
            tool_use("mcp__probe__probe", {"text": "hi", "port": port}, id="toolu_probe"),
            tool_use("mcp__probe__probe", {"text": "x", "port": "nope"}, id="toolu_bad"),
            tool_use("mcp__sh__echo_args", {"text": "; rm -rf /"}, id="toolu_echo"),
            text("Done."),
        )
        agent = await make_agent(
            api, policy=await make_policy(api, POLICY), harness="claude-agent-sdk", model=MODEL,
            capability_bundles=[bundle],
            connection_requirements=[
                {"slot": "sh", "connector": {"url": f"sandbox-cli://{cli}"}, "required_tools": ["echo_args"]}
            ],
        )  # fmt: skip
        run_id = await start_run(api, agent, workspace=workspace)
        row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
    evs = await events(api, run_id)
    assert row["status"] == "completed", of_type(evs, "run.error")
    offered = [t["name"] for t in messages_requests(llm_upstream)[0].get("tools", [])]
    assert {"mcp__probe__probe", "mcp__sh__echo_args"} <= set(offered)
    results = tool_results(messages_requests(llm_upstream)[-1])
    assert "cwd=/workspace network=unreachable tokens=none text=hi" in result_text(results["toolu_probe"])
    assert result_text(results["toolu_echo"]).split("\n")[0] == "[; rm -rf /]"
    assert "arguments rejected by frozen schema: /port" in result_text(results["toolu_bad"])
    verdicts = {d["tool_call_id"]: (d["verdict"], d["source"]) for d in of_type(evs, "tool.decision")}
    assert verdicts["toolu_probe"] == ("allow", "policy") and verdicts["toolu_bad"] == ("deny", "schema")
    assert verdicts["toolu_echo"] == ("allow", "policy")
    assert not of_type(evs, "tool.brokered")
    said = [m["text"] for m in of_type(evs, "agent.message")]
    assert "sandbox tools mounted: mcp__probe__probe, mcp__sh__echo_args" in said


async def test_claude_proposes_a_connection_that_a_human_approves(
    api: httpx.AsyncClient, llm_upstream: Upstream
) -> None:
    url = f"http://localhost:9/{unique('mcp')}"
    llm_upstream.push(
        tool_use("mcp__fluidbox__propose_connection", {"base_url": url, "display_name": "docs"}, id="toolu_prop"),
        text("Proposed."),
    )
    dynamic = {"enabled": True, "allowedHosts": ["localhost"]}
    agent = await make_agent(
        api, policy=await make_policy(api, {"defaults": {"tool_action": "deny"},
                                            "tools": [{"match": ["ProposeConnection"], "action": "allow"}]}),
        harness="claude-agent-sdk", model=MODEL, harness_config={"dynamic_connections": dynamic},
    )  # fmt: skip
    run_id = await start_run(api, agent, workspace=None)
    approval = await wait_pending(api, run_id, timeout=120)
    assert (approval["tool"], approval["tool_call_id"]) == ("ProposeConnection", "toolu_prop")
    r = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
    assert r.status_code == 200, r.text
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
    evs = await events(api, run_id)
    assert row["status"] == "completed", of_type(evs, "run.error")
    [saved] = [c for c in (await api.get("/v1/connections")).json()["connections"] if c["base_url"] == url]
    assert saved["status"] == "pending" and saved["metadata"]["proposed_in"] == run_id
    answer = result_text(tool_results(messages_requests(llm_upstream)[-1])["toolu_prop"])
    assert answer.startswith(f"saved connection {saved['id']} (pending)")
    assert [d["connection_id"] for d in of_type(evs, "connection.saved")] == [saved["id"]]
