"""A server nobody here wrote: the npm reference server @modelcontextprotocol/server-everything, brokered end to end.

`make install` puts the pinned package under ``.node/``. The server runs with an environment of only PATH and
PORT, because its ``get-env`` tool returns its whole environment to any caller. It has no host setting and listens on
every interface, so it lives only for this module.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.stack import free_port
from tests.integration.helpers import ROOT, events, make_agent, make_policy, start_run, wait_status

pytestmark = pytest.mark.stack

PACKAGE = ROOT / ".node" / "node_modules" / "@modelcontextprotocol" / "server-everything"
ENTRY = PACKAGE / "dist" / "index.js"
READY_TIMEOUT_S = 15.0

POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [{"match": ["mcp__everything__*"], "action": "allow"}],
}


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The loopback URL of a freshly started server-everything (Streamable HTTP) on a free port."""
    node = shutil.which("node")
    if node is None or not ENTRY.is_file():
        missing = "node is not on PATH" if node is None else f"no {ENTRY}"
        pytest.fail(
            f"server-everything cannot run ({missing}): install Node.js 20+ and run `make install`",
            pytrace=False,
        )
    port = free_port()
    log_path = tmp_path_factory.mktemp("everything") / "server.log"
    env = {"PATH": os.environ.get("PATH", os.defpath), "PORT": str(port)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [node, str(ENTRY), "streamableHttp"],
            cwd=PACKAGE,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _listening(port):
            if proc.poll() is not None:
                pytest.fail(f"server-everything exited ({proc.returncode}): {log_path.read_text()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(
                    f"server-everything not listening after {READY_TIMEOUT_S}s: {log_path.read_text()}", pytrace=False
                )
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass


async def connect(api: httpx.AsyncClient, url: str) -> dict[str, Any]:
    # The server ignores authorization; a static connection still needs some token.
    r = await api.post(
        "/v1/connections", json={"provider": "mcp_http", "access": {"read": True}, "base_url": url, "token": "unused"}
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_the_photograph_lists_the_reference_servers_tools(api: httpx.AsyncClient, everything: str) -> None:
    created = await connect(api, everything)
    assert created["connection"]["status"] == "active"
    snapshot = created["snapshot"]
    assert snapshot["version"] == 1 and snapshot["protocol_version"] == "2025-11-25"
    names = {t["name"] for t in snapshot["tools"]}
    assert {"echo", "get-sum", "get-env"} <= names and len(names) >= 10, names
    r = await api.get(f"/v1/connections/{created['connection']['id']}/tools")
    assert r.status_code == 200 and r.json()["snapshot"]["tools_digest"] == snapshot["tools_digest"]


async def test_a_run_calls_the_reference_server_through_the_broker(api: httpx.AsyncClient, everything: str) -> None:
    await connect(api, everything)
    script = [
        {"tool": "mcp__everything__get-sum", "input": {"a": 2, "b": 3}},
        {"tool": "mcp__everything__echo", "input": {"message": "hi"}},
        {"tool": "mcp__everything__get-sum", "input": {"a": "two", "b": 3}},
    ]
    requirement = {"slot": "everything", "connector": {"url": everything}, "required_tools": ["echo", "get-sum"]}
    agent = await make_agent(api, script, policy=await make_policy(api, POLICY), connection_requirements=[requirement])
    run_id = await start_run(api, agent)
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["status"] == "completed", row
    assert row["result_summary"] == "Replay complete: 2 executed, 1 denied."
    surface = row["run_spec"]["brokered"][0]
    assert surface["slot"] == "everything" and surface["protocol_version"] == "2025-11-25"
    assert sorted(t["name"] for t in surface["tools"]) == ["echo", "get-sum"], "only the required tools are frozen"

    evs = await events(api, run_id)
    said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
    assert "mcp__everything__get-sum → The sum of 2 and 3 is 5." in said, said
    assert "mcp__everything__echo → Echo: hi" in said, said
    brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
    assert [(b["tool"], b["outcome"], b["ok"]) for b in brokered] == [
        ("mcp__everything__get-sum", "succeeded", True),
        ("mcp__everything__echo", "succeeded", True),
    ], "the schema-breaking call is never sent"
    assert all(b["server"] == "everything" for b in brokered)
    denied = [
        e["payload"]["data"] for e in evs
        if e["type"] == "tool.decision" and e["payload"]["data"]["verdict"] == "deny"
    ]  # fmt: skip
    assert len(denied) == 1 and denied[0]["tool"] == "mcp__everything__get-sum", denied
    assert denied[0]["source"] == "schema" and denied[0]["reason"] == "arguments rejected by frozen schema: /a"
    assert any("denied: arguments rejected by frozen schema: /a" in text for text in said), said
