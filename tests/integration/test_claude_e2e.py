"""The claude-agent-sdk harness end to end: the real Claude Code CLI (bundled in the SDK's wheel) in a real
bubblewrap sandbox, model traffic through the loopback relay and the LLM facade to the scripted upstream,
every tool call through the real gate.

No model: the scripted upstream (tests/llm_upstream.py) answers with canned tool_use and text turns, and
records every request, so the tests read what the CLI sent back (tool results included).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.integration.conftest import LLM_UPSTREAM_KEY
from tests.integration.helpers import (
    events,
    make_agent,
    make_policy,
    start_run,
    wait_pending,
    wait_status,
)
from tests.llm_upstream import Upstream, Usage, text, tool_use
from tests.mcp_servers import basic, serve

pytestmark = pytest.mark.stack

MODEL = "claude-haiku-4-5"
# Every command line and initial environment in the sandbox (the runner's, the CLI's, the shell's), counted
# for run tokens; the character class keeps the pattern from matching its own command line.
PROC_TOKENS = (
    "PROC_TOKENS:$(cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c 'fbx_[s]ess_')"
)
POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "approvals": {"default_ttl_secs": 300},
    "tools": [
        {"match": ["Read", "Glob", "Grep", "LS"], "action": "allow"},
        {"match": ["Write", "Edit"], "action": "allow", "paths": {"allow": ["/workspace/**"]}},
        {
            "match": ["Bash"],
            "action": "allow",
            "shell": {
                "allow_prefixes": ["env", "echo ", "ls", "cat "],
                "deny_regex": ["nonce_denied"],
                "on_no_match": "approve",
            },
        },
        {"match": ["mcp__*"], "action": "allow"},
    ],
}


async def claude_agent(api: httpx.AsyncClient, **extra: Any) -> str:
    policy = await make_policy(api, POLICY)
    return await make_agent(api, policy=policy, harness="claude-agent-sdk", model=MODEL, **extra)


def tool_results(request_body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every tool_result block the CLI sent back in one Messages request, by tool_use_id."""
    found: dict[str, dict[str, Any]] = {}
    for message in request_body.get("messages", []):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                found[block["tool_use_id"]] = block
    return found


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(c.get("text", "") for c in content or [] if isinstance(c, dict))


def messages_requests(upstream: Upstream) -> list[dict[str, Any]]:
    return [r.body for r in upstream.requests if r.path == "/v1/messages" and isinstance(r.body, dict)]


def of_type(evs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["payload"]["data"] for e in evs if e["type"] == kind]


def workspace(stack: Stack, run_id: str) -> Path:
    return stack.home / "runs" / run_id / "workspace"


async def test_every_claude_tool_call_is_decided_by_the_gate_and_denied_calls_never_run(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    nonce = secrets.token_hex(8)
    denied_file, allowed_file = f"nonce_denied_{nonce}.txt", f"allowed_{nonce}.txt"
    llm_upstream.push(
        tool_use("Bash", {"command": f"env && echo {PROC_TOKENS}", "description": "inspect"}, id="toolu_env"),
        tool_use("Bash", {"command": f"touch {denied_file}", "description": "d"}, id="toolu_denied"),
        tool_use("Bash", {"command": f"echo {nonce} > {allowed_file}", "description": "a"}, id="toolu_allowed"),
        # Read-only calls the CLI would run without asking anyone if the hook did not force the question.
        tool_use("Bash", {"command": f"cat {allowed_file} | wc -c", "description": "r"}, id="toolu_readonly"),
        tool_use("Read", {"file_path": f"/workspace/{allowed_file}"}, id="toolu_read"),
        text(f"Wrote {allowed_file}; the other file was refused."),
    )
    agent = await claude_agent(api, system_prompt="You are a careful test agent.")
    run_id = await start_run(api, agent)
    row = await wait_status(api, run_id, {"completed", "failed", "cancelled", "budget_exceeded"}, timeout=120)
    evs = await events(api, run_id)
    assert row["status"] == "completed", of_type(evs, "run.error")
    assert row["result_summary"] == f"Wrote {allowed_file}; the other file was refused."

    # Every tool call was put to the gate exactly once, under the model's own tool_use id.
    requested = of_type(evs, "tool.requested")
    ids = ["toolu_env", "toolu_denied", "toolu_allowed", "toolu_readonly", "toolu_read"]
    assert sorted(r["tool_call_id"] for r in requested) == sorted(ids)
    decisions = {d["tool_call_id"]: d["verdict"] for d in of_type(evs, "tool.decision")}
    assert decisions == {i: ("deny" if i == "toolu_denied" else "allow") for i in ids}

    # The denied command never ran; the allowed one did (the workspace diff is collected server-side).
    outputs = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert allowed_file in outputs["diff"] and nonce in outputs["diff"]
    assert denied_file not in outputs["diff"]
    assert not (workspace(stack, run_id) / denied_file).exists()

    # What the model saw: the deny reason, and the env of the CLI's shell without any token or run variable.
    final = messages_requests(llm_upstream)[-1]
    results = tool_results(final)
    assert results["toolu_denied"].get("is_error") is True
    assert "nonce_denied" in result_text(results["toolu_denied"])
    env_output = result_text(results["toolu_env"])
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:" in env_output, "this is the real env of the CLI's shell"
    assert "fbx_sess_" not in env_output and "FLUIDBOX_" not in env_output
    assert "PROC_TOKENS:0" in env_output, "no process in the sandbox carries a run token in its argv or environ"
    assert nonce in result_text(results["toolu_readonly"]) or "17" in result_text(results["toolu_readonly"])

    # Model traffic: the frozen model and system prompt, the real key swapped in by the facade.
    bodies = messages_requests(llm_upstream)
    assert len(bodies) == 6 and {b["model"] for b in bodies} == {MODEL}
    assert "You are a careful test agent." in json.dumps(bodies[0]["system"])
    keys = {r.headers.get("x-api-key") for r in llm_upstream.requests if r.path == "/v1/messages"}
    assert keys == {LLM_UPSTREAM_KEY}

    # Narration: the harness starting, tool completions, and the final assistant text.
    said = of_type(evs, "agent.message")
    assert said[0]["text"] if said else False
    assert any(m["text"].startswith("claude-agent-sdk runner starting") for m in said)
    completed = {c["tool_call_id"]: c for c in of_type(evs, "tool.completed")}
    assert set(completed) == set(ids) and completed["toolu_denied"]["ok"] is False
    assert completed["toolu_allowed"]["ok"] is True
    assert any(m.get("role") == "assistant" and allowed_file in m["text"] for m in said)


async def test_an_approval_holds_the_tool_until_a_human_decides(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    nonce = secrets.token_hex(8)
    held_file = f"held_{nonce}.txt"
    llm_upstream.push(
        tool_use("Bash", {"command": f"touch {held_file}", "description": "needs approval"}, id="toolu_held"),
        text("Done after approval."),
    )
    agent = await claude_agent(api)
    run_id = await start_run(api, agent)
    pending = await wait_pending(api, run_id)
    assert pending["tool"] == "Bash" and pending["tool_call_id"] == "toolu_held"
    # Held: the command has not run and the model has not been asked again.
    assert not (workspace(stack, run_id) / held_file).exists()
    assert len(messages_requests(llm_upstream)) == 1
    r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    assert r.status_code == 200, r.text
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
    assert row["status"] == "completed" and row["result_summary"] == "Done after approval."
    outputs = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert held_file in outputs["diff"]
    results = tool_results(messages_requests(llm_upstream)[-1])
    assert results["toolu_held"].get("is_error") is not True


async def test_a_brokered_tool_call_reaches_the_real_mcp_server_through_the_broker(
    api: httpx.AsyncClient, llm_upstream: Upstream
) -> None:
    async with serve(basic()) as srv:
        r = await api.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "access": {"read": True},
                "base_url": srv.url,
                "token": "tok-" + secrets.token_hex(8),
            },
        )
        assert r.status_code == 200, r.text
        llm_upstream.push(
            tool_use("mcp__calc__add", {"a": 20, "b": 22}, id="toolu_add"),
            text("The sum is 42."),
        )
        agent = await claude_agent(
            api, connection_requirements=[{"slot": "calc", "connector": {"url": srv.url}, "required_tools": ["add"]}]
        )
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
        evs = await events(api, run_id)
        assert row["status"] == "completed", of_type(evs, "run.error")
        assert srv.call_count("add") == 1
    assert row["result_summary"] == "The sum is 42."
    # The CLI was offered the frozen brokered tool inline, and got the server's answer back.
    first, last = messages_requests(llm_upstream)[0], messages_requests(llm_upstream)[-1]
    assert "mcp__calc__add" in [t["name"] for t in first.get("tools", [])]
    assert result_text(tool_results(last)["toolu_add"]).split("\n")[0] == "42"
    # Decided once, by the broker's gate, under the model's tool_use id.
    decisions = [d for d in of_type(evs, "tool.decision") if d["tool_call_id"] == "toolu_add"]
    assert len(decisions) == 1 and decisions[0]["verdict"] == "allow"
    brokered = of_type(evs, "tool.brokered")
    assert len(brokered) == 1 and brokered[0]["outcome"] == "succeeded"
    said = [m["text"] for m in of_type(evs, "agent.message")]
    assert "brokered tools mounted: mcp__calc__add" in said


async def test_model_spend_is_metered_exactly_and_the_cost_cap_stops_the_next_request(
    api: httpx.AsyncClient, llm_upstream: Upstream
) -> None:
    # Haiku at $1/$5 per MTok, cache read 0.1x and write 1.25x input: 0.010 + 0.005 + 0.0002 + 0.0025 = $0.0177.
    spent = Usage(input=10_000, output=1_000, cache_read=2_000, cache_write=2_000)
    llm_upstream.push(
        tool_use("Bash", {"command": "echo spent", "description": "x"}, id="toolu_spend", usage=spent),
        text("never reached"),
    )
    agent = await claude_agent(api)
    run_id = await start_run(api, agent, budgets={"max_cost_usd": 0.01})
    row = await wait_status(api, run_id, {"completed", "failed", "budget_exceeded"}, timeout=120)
    evs = await events(api, run_id)
    assert row["status"] == "budget_exceeded", (row["status"], of_type(evs, "run.error"))
    # The first request was admitted alone (its estimate alone exceeds the cap) and charged exactly what the
    # upstream reported; the next one was stopped before it was forwarded.
    assert len(messages_requests(llm_upstream)) == 1
    responses = of_type(evs, "model.response")
    assert len(responses) == 1
    tokens = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    assert [responses[0][k] for k in tokens] == [10_000, 1_000, 2_000, 2_000]
    assert responses[0]["model"] == MODEL and float(responses[0]["cost_usd"]) == pytest.approx(0.0177)
    stops = of_type(evs, "budget.exceeded")
    assert len(stops) == 1 and stops[0]["budget"] == "max_cost_usd"
    report = (await api.get(f"/v1/sessions/{run_id}/cost")).json()
    assert float(report["usage"]["cost_usd"]) == pytest.approx(0.0177)
    assert report["usage"]["input_tokens"] == 10_000 and report["usage"]["output_tokens"] == 1_000


async def test_an_upstream_error_fails_the_run_with_the_reason(api: httpx.AsyncClient, llm_upstream: Upstream) -> None:
    from tests.llm_upstream import failure

    # Every answer is the error, however often the CLI retries.
    llm_upstream.default = failure(400, "scripted upstream refuses this request")
    agent = await claude_agent(api)
    run_id = await start_run(api, agent)
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
    assert row["status"] == "failed"
    errors = of_type(await events(api, run_id), "run.error")
    assert errors and "scripted upstream refuses this request" in errors[-1]["message"]
    assert "scripted upstream refuses this request" in (row["result_summary"] or "")


async def test_cancelling_a_claude_run_mid_approval_stops_it_without_running_the_tool(
    api: httpx.AsyncClient, stack: Stack, llm_upstream: Upstream
) -> None:
    nonce = secrets.token_hex(8)
    held_file = f"never_{nonce}.txt"
    llm_upstream.push(tool_use("Bash", {"command": f"touch {held_file}", "description": "held"}, id="toolu_cancel"))
    agent = await claude_agent(api)
    run_id = await start_run(api, agent)
    await wait_pending(api, run_id)
    r = await api.post(f"/v1/sessions/{run_id}/cancel")
    assert r.status_code in (200, 202), r.text
    row = await wait_status(api, run_id, {"cancelled", "completed", "failed"}, timeout=60)
    assert row["status"] == "cancelled"
    evs = await events(api, run_id)
    assert not of_type(evs, "run.result") or "cancel" in json.dumps(of_type(evs, "run.result"))
    assert not of_type(evs, "run.error"), "a quiesced runner exits quietly"
    assert not (workspace(stack, run_id) / held_file).exists()
    assert len(messages_requests(llm_upstream)) == 1, "the model was never asked again"
