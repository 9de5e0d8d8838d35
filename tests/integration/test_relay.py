"""``transport: relay``: an MCP server behind a device, reached through a real HTTPS relay whose certificate
comes from a CA the test created. The relay credential is the canary: it must never appear in a response,
the ledger, a RunSpec, a log line or a sandbox."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.integration.helpers import events, issue_token, make_agent, make_policy, start_run, wait_status
from tests.mcp_servers import basic, serve
from tests.relay_servers import tls_relay

pytestmark = pytest.mark.stack

POLICY: dict[str, Any] = {"defaults": {"tool_action": "deny"}, "tools": [{"match": ["mcp__*"], "action": "allow"}]}


def requirement(url: str, tools: list[str]) -> dict[str, Any]:
    return {"slot": "dev", "connector": {"url": url}, "required_tools": tools}


async def connect_relay(api: httpx.AsyncClient, url: str, token: str, **config: Any) -> httpx.Response:
    body: dict[str, Any] = {"provider": "relay", "base_url": url, "token": token, "access": {"read": True}}
    if config:
        body["transport_config"] = config
    return await api.post("/v1/connections", json=body)


async def test_a_relay_connection_brokers_calls_to_the_server_behind_it_and_never_leaks_its_credential(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    canary = "relay-canary-" + secrets.token_hex(16)
    async with serve(basic()) as upstream, tls_relay(upstream.url, canary) as relay:
        untrusted = await connect_relay(api, relay.url, canary)
        assert untrusted.status_code == 502 and "certificate" in untrusted.json()["error"].lower(), untrusted.text
        wrong = await connect_relay(api, relay.url, "not-the-credential", ca_pem=relay.ca_pem)
        assert wrong.status_code == 400 and "rejected this credential" in wrong.json()["error"], wrong.text
        for config, message in [
            ({"timeout_s": 0}, "timeout_s must be"),
            ({"ca_pem": "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"}, "no private key"),
            ({"headers": {"x": "y"}}, "unknown relay setting"),
        ]:
            r = await connect_relay(api, relay.url, canary, **config)
            assert r.status_code == 400 and message in r.json()["error"], r.text
        plain = await connect_relay(api, relay.url.replace("https://", "http://"), canary)
        assert plain.status_code == 400 and "must be https" in plain.json()["error"]
        assert not [c for c in (await api.get("/v1/connections")).json()["connections"] if c["base_url"] == relay.url]

        created = await connect_relay(api, relay.url, canary, ca_pem=relay.ca_pem, timeout_s=10)
        assert created.status_code == 200, created.text
        connection = created.json()["connection"]
        assert connection["transport"] == "relay" and connection["transport_config"]["timeout_s"] == 10
        assert {t["name"] for t in created.json()["snapshot"]["tools"]} >= {"add", "echo"}
        refreshed = await api.post(f"/v1/connections/{connection['id']}/tools/refresh")
        assert refreshed.status_code == 200 and refreshed.json()["snapshot"]["version"] == 2, refreshed.text
        script = [{"tool": "mcp__dev__add", "input": {"a": 2, "b": 3}}]
        agent = await make_agent(
            api,
            script,
            policy=await make_policy(api, POLICY),
            connection_requirements=[requirement(relay.url, ["add"])],
        )
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"})
        evs = await events(api, run_id)
        said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
        assert row["result_summary"] == "Replay complete: 1 executed, 0 denied.", said
        assert "mcp__dev__add → 5" in said
        assert upstream.call_count("add") == 1 and relay.refused.count("POST") >= 1
        brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
        assert [b["outcome"] for b in brokered] == ["succeeded"]
        listed = (await api.get("/v1/connections")).text
        detail = (await api.get(f"/v1/connections/{connection['id']}")).text
        logs = "".join(p.read_text(errors="replace") for p in Path(stack.logs).glob("*.log"))
        sandbox_logs = "".join(p.read_text(errors="replace") for p in (stack.home / "runs").glob("*/sandbox.log"))
        for text in (created.text, listed, detail, json.dumps(evs), json.dumps(row), logs, sandbox_logs):
            assert canary not in text


async def test_relay_calls_execute_upstream_exactly_once(api: httpx.AsyncClient, stack: Stack) -> None:
    canary = "relay-" + secrets.token_hex(8)
    async with serve(basic()) as upstream, tls_relay(upstream.url, canary) as relay:
        created = await connect_relay(api, relay.url, canary, ca_pem=relay.ca_pem, timeout_s=2)
        assert created.status_code == 200, created.text
        agent = await make_agent(
            api, [{"sleep_ms": 600000}], policy=await make_policy(api, POLICY),
            connection_requirements=[requirement(relay.url, ["add", "slow"])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        await wait_status(api, run_id, {"running"})
        token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as runner:
            body = {"tool_call_id": "relay-dup", "tool": "mcp__dev__add", "input": {"a": 20, "b": 22}}
            url = f"/internal/sessions/{run_id}/tools/call"
            answers = await asyncio.gather(*[runner.post(url, json=body) for _ in range(5)])
            assert len({a.text for a in answers}) == 1, "duplicates get byte-identical answers"
            assert answers[0].json()["ok"] is True and answers[0].json()["result"]["content"][0]["text"] == "42"
            again = await runner.post(url, json=body)
            assert again.text == answers[0].text
            # The relay's timeout bounds a call that never answers: its outcome is unknown, and it is never re-sent.
            slow = {"tool_call_id": "relay-slow", "tool": "mcp__dev__slow", "input": {"seconds": 30}}
            first = (await runner.post(url, json=slow)).json()
            second = (await runner.post(url, json=slow)).json()
            assert first == second == {"ok": False, "error": "brokered call outcome ambiguous — not retried"}
        assert upstream.call_count("add") == 1 and upstream.call_count("slow") == 1
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})
