"""Small, bounded helpers for driving runs through the public API in tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from cli.stack import Stack, admin_token
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
DEMO_REPO = ROOT / "examples" / "demo-repo"
TERMINAL = {"completed", "failed", "cancelled", "budget_exceeded"}


@asynccontextmanager
async def own_stack(
    prefix: str, env: dict[str, str], *, workers: int = 1, apis: int = 1
) -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    """A whole stack of its own (for settings the session's stack must not share), with an admin client
    (of the first API process when it runs ``apis`` of them)."""
    st = Stack.ephemeral(prefix, env)
    st.worker_processes = workers
    st.api_processes = apis
    try:
        await st.start()
        token = admin_token(st.home)[0]
        async with httpx.AsyncClient(
            base_url=st.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as client:
            yield st, client
    finally:
        st.stop()
        shutil.rmtree(st.home, ignore_errors=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def make_policy(api: httpx.AsyncClient, doc: dict[str, Any]) -> str:
    name = unique("pol")
    doc = {**doc, "name": name}
    r = await api.post("/v1/policies", json={"name": name, "yaml": yaml.safe_dump(doc)})
    assert r.status_code == 200, r.text
    return name


async def make_agent(
    api: httpx.AsyncClient, script: list[dict[str, Any]] | None = None, policy: str = "demo", **extra: Any
) -> str:
    name = unique("agent")
    body: dict[str, Any] = {"name": name, "harness": "replay", "policy": policy, **extra}
    if script is not None:
        body["harness_config"] = {"script": script}
    r = await api.post("/v1/agents", json=body)
    assert r.status_code == 200, r.text
    return name


async def start_run(api: httpx.AsyncClient, agent: str, workspace: Path | None = DEMO_REPO, **extra: Any) -> str:
    body: dict[str, Any] = {"agent": agent, "task": "test task", **extra}
    if workspace is not None:
        body["workspace"] = {"kind": "local_copy", "path": str(workspace)}
    r = await api.post("/v1/sessions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["session"]["status"] == "created"
    return str(r.json()["session"]["id"])


async def run_row(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    r = await api.get(f"/v1/sessions/{run_id}")
    assert r.status_code == 200, r.text
    return dict(r.json()["session"])


async def wait_status(api: httpx.AsyncClient, run_id: str, statuses: set[str], timeout: float = 60) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> dict[str, Any] | None:
        seen.update(await run_row(api, run_id))
        return dict(seen) if seen["status"] in statuses else None

    return await eventually(
        reached, timeout=timeout, message=lambda: f"run {run_id} stuck in {seen.get('status')} (wanted {statuses})"
    )


async def wait_pending(
    api: httpx.AsyncClient, run_id: str, timeout: float = 60, skip: set[str] | None = None
) -> dict[str, Any]:
    """The run's first pending approval whose id is not in ``skip`` (waiting for one to appear)."""

    async def first_pending() -> dict[str, Any] | None:
        rows = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
        pending = [r for r in rows if r["status"] == "pending" and r["id"] not in (skip or set())]
        if pending:
            return dict(pending[0])
        status = (await run_row(api, run_id))["status"]
        assert status not in TERMINAL, f"run ended ({status}) before asking for approval"
        return None

    return await eventually(first_pending, timeout=timeout, message="no approval was requested in time")


async def approve_in_turn(api: httpx.AsyncClient, run_id: str, count: int) -> None:
    """Approve the run's next ``count`` approvals one by one, as each is asked."""
    decided: set[str] = set()
    for _ in range(count):
        approval = await wait_pending(api, run_id, skip=decided)
        r = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        decided.add(str(approval["id"]))


async def pending_approvals(
    api: httpx.AsyncClient, want: int, timeout: float = 240, runs: list[str] | None = None
) -> list[dict[str, Any]]:
    """Wait until at least ``want`` approvals are pending across the stack (the approvals inbox).

    With ``runs``, a run that ends before asking fails at once, and a timeout names where the rest are.
    """
    seen: dict[str, Any] = {"rows": [], "elsewhere": []}

    async def enough() -> list[dict[str, Any]] | None:
        r = await api.get("/v1/approvals")
        assert r.status_code == 200, r.text
        rows = list(r.json()["approvals"])
        if len(rows) >= want:
            return rows
        elsewhere: list[tuple[str, str | None]] = []
        if runs is not None:
            waiting = {str(a["session_id"]) for a in rows}
            for run in [run for run in runs if run not in waiting]:
                row = await run_row(api, run)
                elsewhere.append((row["status"], row["status_reason"]))
            assert not [e for e in elsewhere if e[0] in TERMINAL], f"runs ended before asking: {elsewhere}"
        seen.update(rows=rows, elsewhere=elsewhere)
        return None

    return await eventually(
        enough,
        timeout=timeout,
        interval=0.2,
        message=lambda: f"only {len(seen['rows'])} of {want} runs reached their approval; others: {seen['elsewhere']}",
    )


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def events(api: httpx.AsyncClient, run_id: str, after: int = 0) -> list[dict[str, Any]]:
    r = await api.get(f"/v1/sessions/{run_id}/events", params={"after": after, "limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def types(evs: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in evs]


def sandbox_env(run_id: str) -> dict[str, str]:
    """The runner's initial environment, read the way only the host can: /proc/<pid>/environ."""
    needle = f"FLUIDBOX_SESSION_ID={run_id}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in raw.split(b"\0"):
            pairs = [p.split(b"=", 1) for p in raw.split(b"\0") if b"=" in p]
            env = {k.decode(): v.decode(errors="replace") for k, v in pairs}
            env["__pid__"] = pid
            return env
    raise AssertionError(f"no process runs for {run_id}")


async def wait_sandbox_env(run_id: str, timeout: float = 30) -> dict[str, str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return sandbox_env(run_id)
        except AssertionError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def issue_token(database_url: str, run_id: str, audience: str) -> str:
    """A fresh run-scoped token from the store (the runner's own never leave its sandbox)."""
    import secrets

    from db.engine import create_pool
    from tests.helpers import context_over

    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        ctx = context_over(pool)
        spec = await ctx.runs.run_spec(run_id)
        return await ctx.tokens.issue_token(spec.tenant_id, run_id, audience, 600, secrets.token_hex(16))
    finally:
        await pool.close()
