"""Record RunWorkflow histories for the replay test: ``python -m tests.workflows.record``.

Re-record deliberately (and commit the JSON) only when a workflow change is meant to be
incompatible and is guarded by ``workflow.patched``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import httpx

from activities import contracts as c
from cli.stack import Stack
from config.settings import Settings
from config.temporal import connect_client
from tests.integration.conftest import FAST
from tests.integration.helpers import make_agent, make_policy, start_run, wait_pending, wait_status
from tests.mcp_servers import basic, serve

OUT = Path(__file__).resolve().parent / "histories"


async def record() -> None:
    stack = Stack.ephemeral("fbxr-", FAST)
    home = stack.home
    try:
        token = await stack.start()
        client = await connect_client(Settings(temporal_address=stack.temporal_address))
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as api:
            runs: dict[str, str] = {}
            approved = await start_run(api, await make_agent(api))
            pending = await wait_pending(api, approved)
            await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
            await wait_status(api, approved, {"completed"})
            runs["approved"] = approved
            ttl = await make_policy(api, {"defaults": {"tool_action": "approve"}, "approvals": {"default_ttl_secs": 1}})
            expired = await start_run(
                api, await make_agent(api, [{"tool": "Bash", "input": {"command": "x"}}], policy=ttl)
            )
            await wait_status(api, expired, {"completed"})
            runs["expired"] = expired
            cancelled = await start_run(api, await make_agent(api, [{"sleep_ms": 600000}]))
            await wait_status(api, cancelled, {"running"})
            await api.post(f"/v1/sessions/{cancelled}/cancel")
            await wait_status(api, cancelled, {"cancelled"})
            runs["cancelled"] = cancelled
            async with serve(basic()) as srv:
                r = await api.post(
                    "/v1/connections", json={"provider": "mcp_http", "base_url": srv.url, "token": "t0k"}
                )
                assert r.status_code == 200, r.text
                policy = await make_policy(api, {"tools": [{"match": ["mcp__*"], "action": "allow"}]})
                agent = await make_agent(
                    api,
                    [{"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}}],
                    policy=policy,
                    connection_requirements=[
                        {"slot": "calc", "connector": {"url": srv.url}, "required_tools": ["add"]}
                    ],
                )
                brokered = await start_run(api, agent)
                await wait_status(api, brokered, {"completed"})
            runs["brokered"] = brokered
        for name, run_id in runs.items():
            handle = client.get_workflow_handle(c.workflow_id(run_id))
            await handle.result()
            history = await handle.fetch_history()
            (OUT / f"run_{name}.json").write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")
    finally:
        stack.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(record())
    os._exit(0)
