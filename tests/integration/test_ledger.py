"""The ledger: gapless, redacted, and the SSE stream agrees exactly with polling."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.helpers import eventually
from tests.integration.helpers import events, make_agent, make_policy, start_run, wait_sandbox_env, wait_status

pytestmark = pytest.mark.stack


async def read_stream(
    api: httpx.AsyncClient, run_id: str, last_event_id: int | None, stop_after: int | None, until_type: str
) -> list[dict[str, Any]]:
    """Read SSE messages until ``stop_after`` messages or an event of ``until_type`` arrives."""
    headers = {} if last_event_id is None else {"last-event-id": str(last_event_id)}
    got: list[dict[str, Any]] = []

    async def consume() -> None:
        async with api.stream("GET", f"/v1/sessions/{run_id}/events/stream", headers=headers) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            sse_id = None
            async for line in r.aiter_lines():
                if line.startswith("id: "):
                    sse_id = int(line[4:])
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    assert data["seq"] == sse_id
                    got.append(data)
                    if len(got) == stop_after or data["type"] == until_type:
                        return

    await asyncio.wait_for(consume(), 60)
    return got


async def test_stream_resumes_after_last_event_id_without_gaps_or_duplicates(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api, [{"say": f"line {i}"} for i in range(20)]))
    # Follow live from the start, drop the connection after 7 messages, resume from the last id seen.
    first = await read_stream(api, run_id, None, 7, "run.result")
    rest = await read_stream(api, run_id, first[-1]["seq"], None, "run.result")
    streamed = first + rest
    polled = await events(api, run_id)
    assert [e["seq"] for e in streamed] == [e["seq"] for e in polled] == list(range(1, len(polled) + 1))
    assert [(e["type"], e["payload"]) for e in streamed] == [(e["type"], e["payload"]) for e in polled]
    middle = await read_stream(api, run_id, 10, 3, "run.result")
    assert [e["seq"] for e in middle] == [11, 12, 13]
    bad = await api.get(f"/v1/sessions/{run_id}/events/stream", headers={"last-event-id": "abc"})
    assert bad.status_code == 400
    after = (await api.get(f"/v1/sessions/{run_id}/events", params={"after": 30})).json()["events"]
    assert [e["seq"] for e in after] == [e["seq"] for e in polled if e["seq"] > 30]


async def test_token_shaped_strings_never_reach_the_ledger(api: httpx.AsyncClient, admin: str) -> None:
    secrets = [
        "sk-ant-api03-" + "A1b2" * 10,
        "ghp_" + "x" * 36,
        "fbx_sess_" + "ab" * 16,
        "AKIAABCDEFGHIJKLMNOP",
        "Bearer " + "t0k3n" * 5,
        admin,
    ]
    script = [{"say": f"here is a secret: {s}"} for s in secrets]
    script.append({"tool": "Bash", "input": {"command": f"echo {secrets[0]}"}})
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}})
    run_id = await start_run(api, await make_agent(api, script, policy=policy))
    await wait_status(api, run_id, {"completed"})
    raw = json.dumps(await events(api, run_id), ensure_ascii=False)
    for secret in secrets:
        assert secret not in raw
        assert secret.split("_")[-1][:20] not in raw
    assert raw.count("‹redacted›") >= len(secrets)


async def test_the_sandbox_holds_only_run_scoped_tokens_and_cannot_reach_the_host(
    api: httpx.AsyncClient, stack: Stack, admin: str
) -> None:
    host, port = stack.bind.rsplit(":", 1)
    probe = (
        "echo ENV:$(env | cut -d= -f1 | sort | tr '\\n' ' '); "
        f"if (exec 3<>/dev/tcp/{host}/{port}) 2>/dev/null; then echo NET:open; else echo NET:closed; fi; "
        f"if cat {stack.home}/admin-token >/dev/null 2>&1; then echo TOKEN:readable; else echo TOKEN:hidden; fi; "
        "if touch /etc/x 2>/dev/null; then echo ETC:writable; else echo ETC:read-only; fi; "
        "if touch /workspace/x 2>/dev/null; then echo WS:writable; else echo WS:read-only; fi; "
        "echo PROC_TOKENS:$(cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' "
        "| grep -c 'fbx_[s]ess_'); "  # a class: neither this command line nor grep's argv matches itself
        "echo UID:$(id -u)"
    )
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}})
    run_id = await start_run(
        api, await make_agent(api, [{"tool": "Bash", "input": {"command": probe}}, {"sleep_ms": 600000}], policy=policy)
    )
    env = await wait_sandbox_env(run_id)
    allowed = {
        "FLUIDBOX_CONTROL_URL",
        "FLUIDBOX_CONTROL_SOCKET",
        "FLUIDBOX_SESSION_ID",
        "FLUIDBOX_SECRETS_FD",
        "FLUIDBOX_TASK",
        "FLUIDBOX_AUTONOMY",
        "FLUIDBOX_MODEL",
        "FLUIDBOX_HARNESS",
        "FLUIDBOX_WORKSPACE",
        "FLUIDBOX_HEARTBEAT_SECS",
        "FLUIDBOX_TOKEN_TTL_SECS",
        "FLUIDBOX_GATEWAY_STALENESS_SECS",
        "FLUIDBOX_REPLAY_DELAY_MS",
        "FLUIDBOX_REPLAY_SCRIPT",
        "PATH",
        "HOME",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PWD",
        "__pid__",
    }
    assert set(env) <= allowed, set(env) - allowed
    assert admin not in json.dumps(env)
    assert "fbx_sess_" not in json.dumps(env), "tokens must not be in the runner's environment"
    for pid in os.listdir("/proc"):  # nor on any command line on this host
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            assert b"fbx_sess_" not in cmdline, cmdline[:200]
    assert not any("postgres" in v or stack.temporal_address in v for v in env.values() if v)

    async def env_output() -> str | None:
        said = [e["payload"]["data"]["text"] for e in await events(api, run_id) if e["type"] == "agent.message"]
        return next((t for t in said if t.startswith("$ echo ENV:")), None)

    output = await eventually(env_output, timeout=30, message="the runner never printed its environment")
    seen = dict(line.split(":", 1) for line in output.split("\n")[1:] if ":" in line)
    names = seen["ENV"].split()
    assert "PATH" in names
    assert not [n for n in names if n.startswith("FLUIDBOX_") or "TOKEN" in n or "KEY" in n], names
    assert (seen["NET"], seen["TOKEN"], seen["ETC"], seen["WS"], seen["UID"].strip()) == (
        "closed",
        "hidden",
        "read-only",
        "writable",
        "1000",
    )
    assert seen["PROC_TOKENS"] == "0"
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})
