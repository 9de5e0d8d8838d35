"""Capability bundles on the real stack: pins, remove-only narrowing, frozen schemas at the gate (publishing,
listing and refusals are tested in process: ``tests/api/test_capabilities.py``)."""

from __future__ import annotations

import httpx
import pytest

from cli.stack import Stack
from tests.api.test_capabilities import bundle
from tests.integration.helpers import events, issue_token, make_agent, make_policy, start_run, unique, wait_status

pytestmark = pytest.mark.stack


async def test_pins_freeze_into_runs_and_a_run_can_only_narrow_them(api: httpx.AsyncClient, stack: Stack) -> None:
    name = unique("b").replace("-", "_")
    await api.post("/v1/capabilities", json=bundle(name))
    await api.post("/v1/capabilities", json=bundle(name, description="newer"))
    policy = await make_policy(
        api, {"defaults": {"tool_action": "deny"}, "tools": [{"match": ["mcp__*"], "action": "allow"}]}
    )
    pinned_old = await make_agent(api, [{"sleep_ms": 600000}], policy=policy, capability_bundles=[f"{name}@1"])
    revs = (await api.get(f"/v1/agents/{pinned_old}")).json()["revisions"]
    assert [(p["name"], p["version"]) for p in revs[0]["capability_bundles"]] == [(name, 1)]
    for bad, message in [
        ([f"{name}@9"], f"unknown capability bundle '{name}@9'"),
        ([name, f"{name}@1"], "more than once"),
    ]:
        r = await api.post(f"/v1/agents/{pinned_old}/revisions", json={"capability_bundles": bad})
        assert r.status_code == 400 and message in r.json()["error"]
    narrowed = await api.post("/v1/sessions", json={"agent": pinned_old, "task": "t", "capabilities": ["other"]})
    assert narrowed.status_code == 400 and "can only narrow" in narrowed.json()["error"]
    stripped = await api.post("/v1/sessions", json={"agent": pinned_old, "task": "t", "capabilities": []})
    assert stripped.status_code == 200 and stripped.json()["session"]["run_spec"]["capabilities"] == []
    await api.post(f"/v1/sessions/{stripped.json()['session']['id']}/cancel")
    run_id = await start_run(api, pinned_old, workspace=None)
    spec = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["run_spec"]
    frozen = spec["capabilities"][0]
    assert (frozen["name"], frozen["version"]) == (name, 1) and frozen["definition_digest"].startswith("sha256:")
    frozen_event = next(e for e in await events(api, run_id) if e["type"] == "capability.frozen")
    assert frozen_event["payload"]["data"] == {"bundles": [f"{name}@1"], "tools": 1}
    await wait_status(api, run_id, {"running"})
    token = await issue_token(stack.database_url or "", run_id, "tool")
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}) as runner:
        url = f"/internal/sessions/{run_id}/permission"
        ok = await runner.post(url, json={"tool_call_id": "c1", "tool": "mcp__lint__check", "input": {"path": "a.py"}})
        assert ok.json() == {"decision": "allow"}
        bad = await runner.post(url, json={"tool_call_id": "c2", "tool": "mcp__lint__check", "input": {"path": 3}})
        assert bad.json() == {"decision": "deny", "message": "arguments rejected by frozen schema: /path"}
        broker = await runner.post(
            f"/internal/sessions/{run_id}/tools/call",
            json={"tool_call_id": "c3", "tool": "mcp__lint__check", "input": {"path": "a.py"}},
        )
        assert broker.status_code == 400 and "is sandbox-class" in broker.json()["error"]
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})
