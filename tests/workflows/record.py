"""Record RunWorkflow histories for the replay test:
``python -m tests.workflows.record [moved] [--suffix S] [--split-queues]``.

``parked`` records only the two parked-run histories (``run_parked_up_front``, ``run_parked_mid_run``).
``moved`` records only the histories of a run that continued as new (its first run, which ends in
``ContinuedAsNew``, and the resumed run that completes it). ``--suffix`` writes ``run_<name><S>.json``
beside the existing files instead of over them: a history of the code before a ``workflow.patched`` change
must stay until the patch is deprecated (``workflows/patches.py``). ``_v3`` holds runs recorded with
``--split-queues`` (sandbox and broker work on task queues of their own), ``_v4`` runs without, ``_v5`` the
parked runs with ``--split-queues`` (a call parked on the broker queue).

Re-record deliberately (and commit the JSON) only when a workflow change is meant to be
incompatible and is guarded by ``workflow.patched``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import httpx

from cli.stack import Stack
from config.settings import Settings
from config.temporal import connect_client
from contracts import temporal as c
from tests.integration.conftest import FAST
from tests.integration.helpers import approve_in_turn, make_agent, make_policy, start_run, wait_pending, wait_status
from tests.mcp_servers import basic, serve

OUT = Path(__file__).resolve().parent / "histories"
SUFFIX = ""
# --split-queues: sandbox work and brokered calls on task queues of their own (``_v3`` holds those histories).
SPLIT_QUEUES = {"FLUIDBOX_SANDBOX_TASK_QUEUE": "fluidbox-sandbox", "FLUIDBOX_BROKER_TASK_QUEUE": "fluidbox-broker"}
EXTRA: dict[str, str] = {}


async def record() -> None:
    stack = Stack.ephemeral("fbxr-", {**FAST, **EXTRA})
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
                    "/v1/connections",
                    json={"provider": "mcp_http", "access": {"read": True}, "base_url": srv.url, "token": "t0k"},
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
            (OUT / f"run_{name}{SUFFIX}.json").write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")
        # The liveness sweep of the same stack, as far as it got (it runs for the stack's life).
        sweep = await client.get_workflow_handle(c.LIVENESS_SWEEP_ID).fetch_history()
        (OUT / "liveness").mkdir(exist_ok=True)
        (OUT / "liveness" / f"sweep{SUFFIX}.json").write_text(sweep.to_json())
        print(f"recorded the liveness sweep: {len(sweep.events)} events")
    finally:
        stack.stop()
        shutil.rmtree(home, ignore_errors=True)


async def record_moved() -> None:
    stack = Stack.ephemeral("fbxr-", {**FAST, **EXTRA, "FLUIDBOX_RUN_MOVE_AFTER_UPDATES": "2"})
    home = stack.home
    try:
        token = await stack.start()
        client = await connect_client(Settings(temporal_address=stack.temporal_address))
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as api:
            policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
            script = [{"tool": "Bash", "input": {"command": f"echo {n}"}} for n in range(3)]
            run_id = await start_run(api, await make_agent(api, script, policy=policy), workspace=None)
            await approve_in_turn(api, run_id, 3)
            await wait_status(api, run_id, {"completed"})
        handle = client.get_workflow_handle(c.workflow_id(run_id))
        await handle.result()
        runs = [w async for w in client.list_workflows(f'WorkflowId = "{c.workflow_id(run_id)}"')]
        first = min(runs, key=lambda w: w.start_time)
        last = max(runs, key=lambda w: w.start_time)
        for name, execution in (("moved_first", first), ("moved_last", last)):
            history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
            (OUT / f"run_{name}{SUFFIX}.json").write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")
    finally:
        stack.stop()
        shutil.rmtree(home, ignore_errors=True)


async def record_parked() -> None:
    """``parked``: a run parked up front (no connection yet), and one whose brokered call parked mid-run on a
    revoked connection; both resume when a credential arrives (``parked-runs`` patch)."""
    stack = Stack.ephemeral("fbxr-", {**FAST, **EXTRA, "FLUIDBOX_RUN_MOVE_AFTER_UPDATES": "1500"})  # one history each
    home = stack.home
    try:
        token = await stack.start()
        client = await connect_client(Settings(temporal_address=stack.temporal_address))
        async with (
            httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60) as api,
            serve(basic()) as srv,
        ):
            policy = await make_policy(
                api, {"tools": [{"match": ["mcp__*"], "action": "allow"}, {"match": ["Bash"], "action": "approve"}]}
            )
            requirement = {"slot": "calc", "connector": {"url": srv.url}, "required_tools": ["echo"]}
            body = {"agent": "", "task": "t"}
            up_front = await make_agent(
                api, [{"tool": "mcp__calc__echo", "input": {"text": "x"}}], policy=policy,
                connection_requirements=[requirement],
            )  # fmt: skip
            r = await api.post("/v1/sessions", json={**body, "agent": up_front})
            parked = r.json()["session"]["id"]
            await wait_status(api, parked, {"waiting_for_connection"})
            made = await api.post(
                "/v1/connections",
                json={"provider": "mcp_http", "access": {"read": True}, "base_url": srv.url, "token": "t"},
            )  # a connection with no access declared allows no tool (issue 15)
            connection_id = made.json()["connection"]["id"]
            await wait_status(api, parked, {"completed"})
            script = [
                {"tool": "mcp__calc__echo", "input": {"text": "one"}},
                {"tool": "Bash", "input": {"command": "x"}},
                {"tool": "mcp__calc__echo", "input": {"text": "two"}},
            ]
            mid = await make_agent(api, script, policy=policy, connection_requirements=[requirement])
            r = await api.post("/v1/sessions", json={**body, "agent": mid})
            mid_run = r.json()["session"]["id"]
            pending = await wait_pending(api, mid_run)
            await api.post(f"/v1/connections/{connection_id}/revoke")
            await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
            await wait_status(api, mid_run, {"waiting_for_connection"})
            await api.put(f"/v1/connections/{connection_id}/credential", json={"token": "t2"})
            await wait_status(api, mid_run, {"completed"})
        for name, run_id in (("parked_up_front", parked), ("parked_mid_run", mid_run)):
            history = await client.get_workflow_handle(c.workflow_id(run_id)).fetch_history()
            (OUT / f"run_{name}{SUFFIX}.json").write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")
    finally:
        stack.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    import sys

    argv = sys.argv[1:]
    if "--suffix" in argv:
        at = argv.index("--suffix")
        SUFFIX = argv[at + 1]
        del argv[at : at + 2]
    if "--split-queues" in argv:
        EXTRA.update(SPLIT_QUEUES)
        argv.remove("--split-queues")
    asyncio.run(record_moved() if argv == ["moved"] else record_parked() if argv == ["parked"] else record())
    os._exit(0)
